"""Near-duplicates with `paraphrastic-mine --paraphrase`: N English Wikipedia sentences (no two sharing five words
in a row), PLANTED of them copied with
one small edit (a word dropped, replaced, added or two swapped, two letters swapped, case and final punctuation
changed) and the copies mixed in; the command mines the file with --line-numbers and every retrieved pair is
scored, then for each cosine threshold: the share of planted pairs found, and the share of written pairs that
are not planted. Choose the threshold with one --seed and check it on another.

    python benchmarks/bench_near_duplicates.py [--lines 200000] [--planted 10000] [--seed 0]
"""

import argparse
import gzip
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import DATA, machine_header

THRESHOLDS = {
    "cosine": (0.85, 0.88, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98),
    "margin": (1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5),
}


def edit(sentence: str, words: list[str], rng: random.Random) -> str:
    """The sentence with one small edit, picked at random."""
    tokens = sentence.split()
    i = rng.randrange(len(tokens))
    kind = rng.choice(["drop", "replace", "add", "swap", "typo", "surface"])
    if kind == "drop":
        del tokens[i]
    elif kind == "replace":
        tokens[i] = rng.choice(words)
    elif kind == "add":
        tokens.insert(i, rng.choice(words))
    elif kind == "swap" and i + 1 < len(tokens):
        tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
    elif kind == "typo" and len(tokens[i]) > 3:
        j = rng.randrange(len(tokens[i]) - 1)
        tokens[i] = tokens[i][:j] + tokens[i][j + 1] + tokens[i][j] + tokens[i][j + 2 :]
    else:  # surface: case and final punctuation
        return (sentence[0].swapcase() + sentence[1:]).rstrip(".!?") + rng.choice(["", "!", " ."])
    return " ".join(tokens)


def lexically_distinct(pool: list[str], n: int) -> list[str]:
    """The first `n` sentences of `pool` that share no five words in a row (lowercased, punctuation dropped) with
    an earlier one kept: Wikipedia holds near-duplicates of its own ("swiveling" and "swivelling" in one sentence
    twice), which would count as pairs not planted; a lexical rule, independent of the model, keeps them out."""
    seen, kept = set(), []
    for sentence in pool:
        words = re.findall(r"\w+", sentence.lower())
        grams = {tuple(words[i : i + 5]) for i in range(len(words) - 4)}
        if grams and not grams & seen:
            seen |= grams
            kept.append(sentence)
            if len(kept) == n:
                return kept
    sys.exit(f"error: only {len(kept)} lexically distinct sentences, {n} needed")


def corpus(lines: int, planted: int, seed: int) -> tuple[list[str], set[tuple[int, int]]]:
    """`lines` lines: lexically distinct Wikipedia sentences of 6-40 words and `planted` edited copies of some of them, in a
    seeded order; and the planted pairs as (line, line), 1-based, the smaller first."""
    rng = random.Random(seed)
    pool = []
    for name in ("enwiki_2018_articles", "enwiki_early_articles"):
        with gzip.open(DATA / f"train/en_text/{name}.txt.gz", "rt", encoding="utf-8") as f:
            pool += [s.strip() for s in f if 6 <= len(s.split()) <= 40]
    rng.shuffle(pool)
    originals = lexically_distinct(pool, lines - planted)
    words = [w for s in originals[:2000] for w in s.split()]
    copies = [(i, edit(originals[i], words, rng)) for i in rng.sample(range(len(originals)), planted)]
    copies = [(i, c) for i, c in copies if c != originals[i]]
    texts = originals + [c for _, c in copies]
    order = list(range(len(texts)))
    rng.shuffle(order)
    place = {old: new + 1 for new, old in enumerate(order)}
    pairs = {tuple(sorted((place[i], place[len(originals) + k]))) for k, (i, _) in enumerate(copies)}
    return [texts[i] for i in order], pairs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--planted", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load-file", default="default")
    p.add_argument("--criterion", choices=list(THRESHOLDS), default="cosine")
    p.add_argument("--show", type=int, default=0, help="print this many of the best-scoring pairs not planted")
    args = p.parse_args()
    print(machine_header())
    lines, planted = corpus(args.lines, args.planted, args.seed)
    with tempfile.TemporaryDirectory() as work:
        text, out = Path(work) / "corpus.txt", Path(work) / "pairs.tsv"
        text.write_text("".join(s + "\n" for s in lines), encoding="utf-8")
        cmd = ["paraphrastic-mine", "--paraphrase", str(text), "--output-file", str(out), "--load-file",
               args.load_file, "--line-numbers", "--criterion", args.criterion, "--threshold=-inf", "--quiet"]  # fmt: skip
        began = time.perf_counter()
        subprocess.run(cmd, check=True)
        took = time.perf_counter() - began
        rows = [line.split("\t", 3) for line in out.read_text(encoding="utf-8").splitlines()]
    scores = np.array([float(r[0]) for r in rows])
    hit = np.array([tuple(sorted((int(r[1]), int(r[2])))) in planted for r in rows])
    print(f"{len(lines):,} lines, {len(planted):,} planted near-duplicates, seed {args.seed}, model {args.load_file}")
    print(f"`{' '.join(cmd[:1] + cmd[3:4])} ...` retrieved {len(rows):,} pairs in {took:.1f} s")
    print(f"| --threshold ({args.criterion}) | pairs written | planted found | found % | not planted % |")
    print("|---|---|---|---|---|")
    for t in THRESHOLDS[args.criterion]:
        kept = scores >= t
        found, written = int((hit & kept).sum()), int(kept.sum())
        other = 100 * (written - found) / max(written, 1)
        print(f"| {t} | {written:,} | {found:,} | {100 * found / len(planted):.1f} | {other:.1f} |")
    for r in [r for r, h in zip(rows, hit, strict=True) if not h][: args.show]:
        print("\t".join(r))


if __name__ == "__main__":
    sys.exit(main())
