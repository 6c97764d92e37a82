"""The demo's search view at scale: embed N sentences once, then time queries against them.

    python benchmarks/bench_search.py [--sentences 1000000] [--queries 50] [--k 5] [--threads N]

The corpus is real text where it is available: the English Wikipedia sentences of
../shared/data/train/en_text/*.gz, in file order (1,160,363 lines); the queries are the 50 lines that follow
the corpus there. Without that data (or past its end) the script says so and makes synthetic template
sentences instead. The model is the shipped English one; the corpus is embedded and searched by demo.py's own
functions (embed_corpus, search: a float16 matrix-vector scan, argpartition, then score_raw_text on the
shortlist). Prints corpus size and source, embedding time, query time (median and p95, query embedding
included), peak RSS and the CPU model.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import resource
import time
from pathlib import Path

import numpy as np
import torch
from common import cpu_name

from paraphrastic import demo
from paraphrastic.models import load_model
from paraphrastic.workers import use_threads

EN_TEXT = Path(os.environ.get("PARAPHRASTIC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
EN_TEXT = EN_TEXT / "train" / "en_text"
WORDS = ("the a one every some old new small large red quiet busy man woman child dog city river team market "
         "is was runs sees finds plays builds opens closes near in under over after before today").split()  # fmt: skip


def real_sentences(n: int) -> list[str]:
    """Up to n non-blank lines of the English Wikipedia text files, in file order."""
    out: list[str] = []
    for path in sorted(EN_TEXT.glob("*.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out += (line.strip() for line, _ in zip(f, range(n - len(out)), strict=False) if line.strip())
        if len(out) >= n:
            break
    return out


def synthetic_sentences(n: int, seed: int = 0) -> list[str]:
    """n seeded sentences of 6 to 14 words from a small word list."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 14))).capitalize() + "." for _ in range(n)]


def sentences(n: int, queries: int) -> tuple[list[str], list[str], str]:
    """(corpus, queries, where they came from): real text first, synthetic sentences for what it lacks."""
    real = real_sentences(n + queries) if EN_TEXT.is_dir() else []
    if len(real) == n + queries:
        return real[:n], real[n:], f"real text ({EN_TEXT})"
    print(f"note: {EN_TEXT} holds {len(real):,} of the {n + queries:,} sentences needed: the rest are synthetic")
    made = real + synthetic_sentences(n + queries - len(real))
    return made[:n], made[n:], f"{len(real):,} real sentences ({EN_TEXT}) + {n + queries - len(real):,} synthetic"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=1_000_000, help="corpus size (default 1,000,000)")
    p.add_argument("--queries", type=int, default=50, help="queries timed (default 50)")
    p.add_argument("--k", type=int, default=5, help="results per query (default 5)")
    p.add_argument("--threads", type=int, help="CPU threads (default: the idle cores)")
    args = p.parse_args()
    threads = use_threads(args.threads)
    start = time.perf_counter()
    corpus_lines, queries, source = sentences(args.sentences, args.queries)
    read_s = time.perf_counter() - start
    model = load_model("default")
    demo.check_corpus_size(len(corpus_lines), model.dim, demo.MAX_CORPUS_LINES, "benchmark corpus")
    start = time.perf_counter()
    corpus = demo.embed_corpus(model, "benchmark", dict(enumerate(corpus_lines, 1)))
    embed_s = time.perf_counter() - start
    demo.search(model, corpus, queries[0], args.k)  # warm-up
    times = np.array([demo.search(model, corpus, q, args.k)[1] for q in queries])
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"corpus: {len(corpus_lines):,} sentences, {source}, read in {read_s:.1f} s")
    print(f"embedding: {embed_s:.1f} s ({len(corpus_lines) / embed_s:,.0f} sentences/s); vectors "
          f"{corpus.vectors.numel() * corpus.vectors.element_size() / 2**20:,.0f} MiB ({corpus.vectors.dtype})")  # fmt: skip
    print(f"query (top {args.k}, {len(queries)} queries): median {np.median(times):.1f} ms, "
          f"p95 {np.percentile(times, 95):.1f} ms, max {times.max():.1f} ms")  # fmt: skip
    print(f"peak RSS: {peak_mib:,.0f} MiB")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, {threads} torch threads; torch {torch.__version__}")
    print(f"example: {queries[0]!r} -> {demo.search(model, corpus, queries[0], 1)[0][0]}")


if __name__ == "__main__":
    main()
