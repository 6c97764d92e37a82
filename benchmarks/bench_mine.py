"""Mining throughput: embed + index + search for 1M English sentences (paraphrase mode of mine_bitext.py).

    python benchmarks/bench_mine.py [--sentences 1000000] [--threads 2] [--nlist N] [--nprobe 16] [--truncate-dim K]

The sentences are every distinct English sentence of ../shared/data (the list of benchmarks/common.py,
516,983 lines) followed by sentences made by joining the first half of one of them to the second half of
another (seeded) until --sentences is reached: real text, partly recombined. The model is the shipped English
model. Prints seconds per stage, sentences/s end to end, peak RSS, and the IVF search's recall of the exact
k nearest neighbours on a sample of queries.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import CACHE, english_sentences, machine_header

from paraphrastic import mine_bitext
from paraphrastic.embed_sentences import embed_file
from paraphrastic.models import load_model


def corpus(n: int, seed: int = 0) -> tuple[Path, int]:
    """A file of n sentences: the real ones first, then seeded half + half recombinations; returns (path, real)."""
    real = english_sentences()[:n]
    rng = random.Random(seed)
    made = []
    for _ in range(n - len(real)):
        a, b = rng.choice(real).split(), rng.choice(real).split()
        made.append(" ".join(a[: len(a) // 2] + b[len(b) // 2 :]))
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"mine-{n}.txt"
    path.write_text("".join(s + "\n" for s in real + made), encoding="utf-8")
    return path, len(real)


class Clock:
    """Wall seconds per named stage."""

    def __init__(self):
        self.stages: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = now - self.last
        self.last = now


def neighbour_recall(side: mine_bitext.Side, ids: np.ndarray, k: int, sample: int) -> float:
    """Share of the exact k nearest neighbours (self excluded) that the search found, on `sample` queries."""
    queries = np.random.default_rng(0).choice(len(side.rows), sample, replace=False)
    q = torch.from_numpy(mine_bitext.side_rows(side, queries))
    best = torch.full((sample, k + 1), -2.0)
    best_ids = torch.zeros((sample, k + 1), dtype=torch.long)
    for start in range(0, len(side.rows), 131072):
        sims = q @ torch.from_numpy(mine_bitext.side_rows(side, slice(start, start + 131072))).T
        top = torch.topk(torch.cat([best, sims], 1), k + 1, dim=1)
        cand = torch.cat([best_ids, torch.arange(start, start + sims.shape[1]).expand(sample, -1)], 1)
        best, best_ids = top.values, torch.gather(cand, 1, top.indices)
    return float(
        np.mean(
            [len((set(a) - {i}) & set(b)) / k for i, a, b in zip(queries, best_ids.tolist(), ids[queries], strict=True)]
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--nlist", type=int)
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--index", default="auto", choices=["auto", "flat", "ivf"])
    p.add_argument("--truncate-dim", type=int, help="mine each sentence's first K values (mine's --truncate-dim)")
    p.add_argument("--recall-sample", type=int, default=1000, help="queries checked against exact search (0: skip)")
    opts = p.parse_args()
    torch.set_num_threads(opts.threads)
    import faiss

    faiss.omp_set_num_threads(opts.threads)
    print(machine_header())
    path, real = corpus(opts.sentences)
    print(f"{opts.sentences:,} sentences: {real:,} real English lines + {opts.sentences - real:,} recombined")
    model = load_model()
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        args = mine_bitext.parse_args(
            ["--paraphrase", str(path), "--output-file", f"{work}/out.tsv", "--index", opts.index,
             "--nprobe", str(opts.nprobe), "--threshold=-inf", "--quiet"]
            + (["--nlist", str(opts.nlist)] if opts.nlist else [])
            + (["--truncate-dim", str(opts.truncate_dim)] if opts.truncate_dim else [])
        )  # fmt: skip
        clock = Clock()
        rows, _ = mine_bitext.mined_rows(path, True, args)
        clock.lap("scan (blank lines, duplicates)")
        embed_file(
            model,
            path,
            f"{work}/v.npy",
            args.dtype,
            batch_size=args.batch_size,
            chunk_lines=args.chunk_lines,
            quiet=True,
            truncate_dim=args.truncate_dim,
        )
        side = mine_bitext.Side(path, np.load(f"{work}/v.npy", mmap_mode="r"), rows)
        clock.lap("embed (float16 memmap)")
        search = mine_bitext.searcher(side, args.k + 1, args)
        clock.lap("index build (train + add)")
        found = mine_bitext.search_chunks(search, side, side, args)
        clock.lap("search (k + 1 neighbours)")
        pairs = mine_bitext.select_pairs(side, side, found, None, args)
        clock.lap("score + retrieve")
        written = mine_bitext.write_pairs(Path(work) / "out.tsv", side, side, pairs, args)
        clock.lap("write pairs")
    n, stages = len(rows), clock.stages
    total = sum(stages.values())
    kind = mine_bitext.index_kind(n, args)
    nlist = mine_bitext.ivf_lists(n, args)
    print(f"index: {kind}" + (f", nlist {nlist}, nprobe {opts.nprobe}" if kind == "ivf" else "") + f", k {args.k}, "
          f"{side.vectors.shape[1]} values a sentence")  # fmt: skip
    for name, seconds in stages.items():
        print(f"  {name:<32} {seconds:8.1f} s")
    print(f"  {'total':<32} {total:8.1f} s")
    print(f"distinct sentences mined: {n:,}; pairs written: {written:,}")
    print(f"throughput: {opts.sentences / total:,.0f} sentences/s end to end; embed alone "
          f"{opts.sentences / stages['embed (float16 memmap)']:,.0f}/s; "
          f"search alone {n / stages['search (k + 1 neighbours)']:,.0f} queries/s")  # fmt: skip
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    if opts.recall_sample:
        ids = mine_bitext.drop_self(*found)[1]
        recall = neighbour_recall(side, ids, args.k, opts.recall_sample)
        print(f"neighbour recall vs exact search ({opts.recall_sample} queries, k {args.k}): {recall:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
