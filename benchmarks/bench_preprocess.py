"""Throughput (lines/s) and peak RSS of each preprocessing step on a synthetic bitext file.

    python benchmarks/bench_preprocess.py --lines 10000000 --work /tmp/bench_preprocess

Each step runs as its own process (as do_all.sh runs it); peak RSS is the largest resident set of
that process and the processes it waited for (pool workers, sort), from wait4.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def synthetic_bitext(path: Path, lines: int, seed: int = 0) -> None:
    """`en<TAB>xx` lines of 3-30 random pseudo-words (5000-word vocabulary per side), written in blocks."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = {side: ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(5000)] for side in ("en", "xx")}
    vocab = {k: np.array(v, dtype=object) for k, v in vocab.items()}
    with open(path, "w") as f:
        for start in range(0, lines, 200_000):
            n = min(200_000, lines - start)
            sides = []
            for side in ("en", "xx"):
                lengths = rng.integers(3, 31, n)
                words = vocab[side][rng.integers(0, 5000, lengths.sum())]
                sides.append([" ".join(w) for w in np.split(words, np.cumsum(lengths)[:-1])])
            f.write("".join(f"{a}\t{b}\n" for a, b in zip(*sides, strict=True)))


def run_step(args: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one `python -m paraphrastic.preprocess.steps` process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "paraphrastic.preprocess.steps", *args, "--force"], env=env, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"step {args[0]} failed ({status})")
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", type=int, default=10_000_000)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_preprocess"))
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--sample-pairs", type=int, default=200_000, help="pairs sentencepiece trains on")
    args = p.parse_args()
    w = args.work
    (w / "in").mkdir(parents=True, exist_ok=True)
    src = w / "in" / "en-xx.synthetic.tsv"
    if not src.exists() or sum(1 for _ in open(src, "rb")) != args.lines:
        t = time.perf_counter()
        synthetic_bitext(src, args.lines)
        print(
            f"generated {args.lines:,} lines ({src.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f}s"
        )
    plan = [
        ("filter", ["filter-bitext", str(w / "in"), "--lang", "xx", "--out", str(w / "filtered.tsv")]),
        ("dedup", ["dedup", str(w / "filtered.tsv"), "--out", str(w / "dedup.tsv"), "--memory", "1G"]),
        ("shuffle", ["shuffle", str(w / "dedup.tsv"), "--out", str(w / "shuffled.tsv")]),
        ("train-sp", ["train-sp", str(w / "shuffled.tsv"), "--out", str(w / "sp.model"),
                      "--vocab-size", str(args.vocab_size), "--sample-pairs", str(args.sample_pairs)]),
        ("encode", ["encode", str(w / "shuffled.tsv"), "--sp-model", str(w / "sp.model"), "--out", str(w / "shards")]),
    ]  # fmt: skip
    total = 0.0
    print(f"{'step':10} {'seconds':>8} {'lines/s':>10} {'peak RSS MiB':>13}   ({os.cpu_count()} cores)")
    for name, step_args in plan:
        seconds, rss = run_step(step_args)
        total += seconds
        print(f"{name:10} {seconds:8.1f} {args.lines / seconds:10,.0f} {rss:13,.0f}", flush=True)
    print(f"{'pipeline':10} {total:8.1f} {args.lines / total:10,.0f}")


if __name__ == "__main__":
    main()
