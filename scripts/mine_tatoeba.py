"""Bitext-mining inputs with known answers from Tatoeba, and the precision/recall report of mined pairs.

    python scripts/mine_tatoeba.py prepare DATA_DIR OUT_DIR     # OUT_DIR/<set>/<lang>.{src,tgt,gold.tsv}
    python scripts/mine_tatoeba.py report OUT_DIR               # reads OUT_DIR/<set>/<lang>.<criterion>.tsv

Sets, for deu, fra and spa (the xx side is the source, English the target, shuffled with a fixed seed):
  test        the LASER Tatoeba test pairs (1000 per language), every source has its translation;
  test-half   the same 1000 sources, but only 500 of their translations (seeded) among the targets, plus
              500 English Tatoeba sentences of the ita test set that are not one of the 1000 translations;
  dev, dev-half  the same layouts from 1000 seeded pairs of the Tatoeba-Challenge file (never trained on;
              exact matches of the test set were filtered out of it, near-duplicates remain).
The report's fixed threshold is the one with the best F1 over the three dev (or dev-half) languages pooled,
so no choice is made on the test sets; the best test threshold is shown beside it only as a ceiling.
"""

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

import numpy as np

LANGS = ("deu", "fra", "spa")
DISTRACTOR_LANG = "ita"
CRITERIA = ("margin", "cosine")
RECALLS = (0.5, 0.7, 0.8, 0.9)


def test_pairs(data: Path, lang: str) -> list[tuple[str, str]]:
    """(xx, English) pairs of the LASER Tatoeba test set."""
    xx = (data / "tatoeba" / f"{lang}-eng.{lang}").read_text(encoding="utf-8").splitlines()
    eng = (data / "tatoeba" / f"{lang}-eng.eng").read_text(encoding="utf-8").splitlines()
    return list(zip(xx, eng, strict=True))


def challenge_pairs(data: Path, lang: str, n: int, seed: int) -> list[tuple[str, str]]:
    """n seeded (xx, English) pairs of the Tatoeba-Challenge file (English is its first column)."""
    path = data / "train" / "bitext" / "tatoeba_challenge_v2021-08-07" / f"en-{lang}.tsv.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    pairs = sorted({(xx, en) for en, xx in rows if en.strip() and xx.strip()})
    return random.Random(seed).sample(pairs, n)


def write_set(folder: Path, lang: str, pairs: list[tuple[str, str]], distractors: list[str], keep: int, seed: int):
    """Source = all xx sides; target = `keep` seeded translations + distractors, shuffled; gold = the kept pairs."""
    rng = random.Random(seed)
    kept = sorted(rng.sample(range(len(pairs)), keep))
    gold_eng = {en for _, en in pairs}
    extra = [s for s in dict.fromkeys(distractors) if s not in gold_eng][: len(pairs) - keep]
    targets = [pairs[i][1] for i in kept] + extra
    rng.shuffle(targets)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{lang}.src").write_text("".join(xx + "\n" for xx, _ in pairs), encoding="utf-8")
    (folder / f"{lang}.tgt").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    (folder / f"{lang}.gold.tsv").write_text("".join(f"{pairs[i][0]}\t{pairs[i][1]}\n" for i in kept), encoding="utf-8")


def prepare(data: Path, out: Path, seed: int = 0) -> None:
    """Write the four sets for every language."""
    test_extra = (data / "tatoeba" / f"{DISTRACTOR_LANG}-eng.eng").read_text(encoding="utf-8").splitlines()
    dev_extra = [en for _, en in challenge_pairs(data, DISTRACTOR_LANG, 3000, seed)]
    for lang in LANGS:
        test, dev = test_pairs(data, lang), challenge_pairs(data, lang, 1000, seed)
        write_set(out / "test", lang, test, [], len(test), seed)
        write_set(out / "test-half", lang, test, test_extra, len(test) // 2, seed)
        write_set(out / "dev", lang, dev, [], len(dev), seed)
        write_set(out / "dev-half", lang, dev, dev_extra, len(dev) // 2, seed)


def scored(folder: Path, lang: str, criterion: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Scores of the mined pairs (best first), whether each is a gold pair, and the number of gold pairs."""
    gold = {tuple(line.split("\t")) for line in (folder / f"{lang}.gold.tsv").read_text(encoding="utf-8").splitlines()}
    rows = [line.split("\t") for line in (folder / f"{lang}.{criterion}.tsv").read_text(encoding="utf-8").splitlines()]
    scores = np.array([float(r[0]) for r in rows])
    correct = np.array([(r[1], r[2]) in gold for r in rows], dtype=bool)
    return scores, correct, len(gold)


def at_threshold(scores: np.ndarray, correct: np.ndarray, gold: int, threshold: float) -> dict:
    """Kept pairs, precision, recall and F1 (x 100) of the pairs scoring at least `threshold`."""
    keep = scores >= threshold
    hits = int(correct[keep].sum())
    p = 100 * hits / max(int(keep.sum()), 1)
    r = 100 * hits / gold
    return {"threshold": threshold, "kept": int(keep.sum()), "P": p, "R": r, "F1": 2 * p * r / max(p + r, 1e-9)}


def best_threshold(runs: list[tuple[np.ndarray, np.ndarray, int]]) -> float:
    """The threshold (one of the scores) with the best F1 over several runs pooled."""
    scores = np.concatenate([s for s, _, _ in runs])
    correct = np.concatenate([c for _, c, _ in runs])
    gold = sum(g for _, _, g in runs)
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(correct[order])
    kept = np.arange(1, len(order) + 1)
    f1 = 2 * hits / (kept + gold)
    return float(scores[order][np.argmax(f1)])


def curve(scores: np.ndarray, correct: np.ndarray, gold: int) -> dict:
    """Best precision at several recall levels and average precision (x 100), over all thresholds."""
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(correct[order])
    precision = hits / np.arange(1, len(order) + 1)
    recall = hits / gold
    out = {
        f"P@R{int(r * 100)}": 100 * float(precision[recall >= r].max()) if (recall >= r).any() else None
        for r in RECALLS
    }
    out["AP"] = 100 * float((precision * correct[order]).sum() / gold)
    return out


def report(out: Path) -> dict:
    """Print the tables (markdown) and return every figure."""
    results: dict = {}
    for setting in ("test", "test-half"):
        dev_set = "dev" if setting == "test" else "dev-half"
        print(f"\n### {setting} (threshold chosen on {dev_set})\n")
        print(
            "| lang | criterion | retrieved: pairs / P / R | dev threshold | kept / P / R / F1 at it | best test F1 (threshold) | P@R50 / 70 / 80 / 90 | AP |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for criterion in CRITERIA:
            threshold = best_threshold([scored(out / dev_set, lang, criterion) for lang in LANGS])
            for lang in LANGS:
                s, c, g = scored(out / setting, lang, criterion)
                every = at_threshold(s, c, g, -np.inf)
                fixed = at_threshold(s, c, g, threshold)
                ceiling = at_threshold(s, c, g, best_threshold([(s, c, g)]))
                cur = curve(s, c, g)
                results.setdefault(setting, {}).setdefault(lang, {})[criterion] = {
                    "all": every, "dev_threshold": fixed, "best": ceiling, "curve": cur,
                }  # fmt: skip
                pr = " / ".join(
                    "-" if cur[f"P@R{int(r * 100)}"] is None else f"{cur[f'P@R{int(r * 100)}']:.1f}" for r in RECALLS
                )
                print(
                    f"| {lang} | {criterion} | {every['kept']} / {every['P']:.1f} / {every['R']:.1f} | {threshold:.3f} | "
                    f"{fixed['kept']} / {fixed['P']:.1f} / {fixed['R']:.1f} / {fixed['F1']:.1f} | "
                    f"{ceiling['F1']:.1f} ({ceiling['threshold']:.3f}) | {pr} | {cur['AP']:.1f} |"
                )
    return results


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare")
    prep.add_argument("data_dir", type=Path)
    prep.add_argument("out_dir", type=Path)
    rep = sub.add_parser("report")
    rep.add_argument("out_dir", type=Path)
    rep.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args()
    if args.command == "prepare":
        prepare(args.data_dir, args.out_dir)
    else:
        figures = report(args.out_dir)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1), encoding="utf-8")
    sys.exit(0)
