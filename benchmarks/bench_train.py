"""Training speed and memory at the paper's settings: dim 1024, 50k pieces, batch 128, M = 100 from the start.

    python benchmarks/bench_train.py [--steps 300] [--big-pairs 10000000] [--threads N]

Prints (1) the machine's fp32 matrix-product rate, measured on the mining's own block shape, and the
exact-mining bound it implies: the pairs/s of a run that did nothing but the mining products;
(2) pairs/s of train.py with its default flags on synthetic HDF5 shards at M = 100 and M = 10,
paraphrase and bitext pools, as a fraction of that bound, with the split of the time between
reading, mining and updates, and the time an update may take at 75% of the bound (where train.py
mines in bf16, also as a fraction of the bound at the measured bf16 product rate, since bf16 mining
can beat the fp32 bound); (3) the mining in bf16 and fp32; (4) one update with row-sparse (lazy)
Adam and with dense Adam, beside its memory floor: only reading and writing back the touched rows of
the weights and both moments, which no exact fp32 Adam can go below; (5) peak RSS of train.py on a
100k-pair and a 10M-pair shard; (6) the sampler's window reads (`--windows-only`: just those). Synthetic ids
(log-uniform over the vocabulary, 5-40 pieces per sentence) stand in for text; a 50k-piece sentencepiece word
model gives the shards their checksum.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
from common import machine_header

from paraphrastic import negatives, shards, train
from paraphrastic.pairs import BLOCK_PAIRS, WINDOW_PAIRS, PairSampler, ShardSet

ROOT = Path(__file__).resolve().parents[1]

VOCAB, DIM, BATCH, M = 50_000, 1024, 128, 100


def word_sentencepiece(folder: Path) -> bytes:
    """A 50k-piece sentencepiece word model (built in well under a second)."""
    words = folder / "words.txt"
    words.write_text("\n".join(" ".join(f"w{i + k}" for k in range(20)) for i in range(0, 60_000, 20)) + "\n")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=str(words), model_writer=buf, model_type="word", vocab_size=VOCAB, minloglevel=2
    )
    return buf.getvalue()


def synthetic_side(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sentence lengths 5-40 and log-uniform ids (a Zipf-like spread over the vocabulary), int32."""
    lengths = rng.integers(5, 41, n)
    ids = np.empty(int(lengths.sum()), dtype=np.int32)
    for lo in range(0, len(ids), 1 << 24):
        chunk = ids[lo : lo + (1 << 24)]
        chunk[:] = np.exp(rng.random(len(chunk)) * np.log(VOCAB - 3)).astype(np.int32) + 2
    return ids, lengths


def write_synthetic_shard(path: Path, n: int, sp: bytes) -> None:
    rng = np.random.default_rng(n)
    shards.write_shard(path, synthetic_side(rng, n), synthetic_side(rng, n), sp, lowercase=True)


def run_train(shard: Path, sp_file: Path, out: Path, steps: int, threads: int | None, m: int, *extra: str) -> dict:
    """Run train.py as a user would; returns its last metrics line and its peak RSS in MiB."""
    cmd = [sys.executable, "-c", RSS_WRAPPER, str(ROOT / "train.py")]
    cmd += ["--train-shards", str(shard), "--sp-model", str(sp_file), "--output-dir", str(out)]
    cmd += ["--dim", str(DIM), "--batch-size", str(BATCH), "--megabatch-size", str(m), "--megabatch-anneal", "0"]
    cmd += ["--max-steps", str(steps), "--log-every", str(m), *extra]
    cmd += ["--threads", str(threads)] if threads else []
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"train.py failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trains = [r for r in records if r["event"] == "train"]
    return {"records": trains, "rss_mib": int(done.stdout.split()[-1]) / 1024}


# Runs train.py in a child process and prints that child's peak RSS (KiB) alone.
RSS_WRAPPER = (
    "import resource, subprocess, sys; "
    "r = subprocess.run([sys.executable] + sys.argv[1:], stdout=subprocess.DEVNULL); "
    "sys.exit(r.returncode) if r.returncode else print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def matmul_rate(threads: int, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a matrix product of the mining's block shape (MINE_CHUNK rows of both sides) in `dtype`."""
    torch.set_num_threads(threads)
    a, b = torch.randn(negatives.MINE_CHUNK, DIM, dtype=dtype), torch.randn(negatives.MINE_CHUNK, DIM, dtype=dtype)
    out = torch.empty(negatives.MINE_CHUNK, negatives.MINE_CHUNK, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b.T, out=out)
    runs, start = 10, time.perf_counter()
    for _ in range(runs):
        torch.mm(a, b.T, out=out)
    return 2 * negatives.MINE_CHUNK**2 * DIM * runs / (time.perf_counter() - start)


def mining_bound(rate: float, m: int, bitext: bool, batch: int = BATCH) -> float:
    """Pairs/s if training did nothing but exact mining's products at `rate` FLOP/s: n pairs cost the
    n x n cross product with bitext, the upper triangle of the 2n x 2n product otherwise."""
    n = m * batch
    flops = 2 * DIM * (n * n if bitext else 2 * n * n)
    return n / (flops / rate)


def throughput(
    folder: Path, shard: Path, sp_file: Path, steps: int, threads: int | None, rate: float, own_rate: float | None
) -> None:
    """pairs/s against the fp32 bound and, when train.py mines in bf16 here, against the bound at bf16's rate."""
    for m in (M, 10):
        for mode in ("paraphrase", "bitext"):
            res = run_train(shard, sp_file, folder / f"run-{mode}-{m}", steps, threads, m, "--mode", mode)
            recs = res["records"]
            later = recs[1:] or recs  # the first window includes warm-up
            pairs_s = sum(r["pairs_per_s"] for r in later) / len(later)
            bound = mining_bound(rate, m, mode == "bitext")
            last = recs[-1]
            total = sum(last[f"seconds_{k}"] for k in ("read", "mine", "update"))
            split = ", ".join(f"{k} {100 * last[f'seconds_{k}'] / total:.0f}%" for k in ("read", "mine", "update"))
            budget = 1000 * BATCH / (0.75 * bound)  # ms a whole update may take at 75% of the bound
            print(
                f"  M = {m:3d} {mode:10s}: {pairs_s:7.0f} pairs/s = {100 * pairs_s / bound:3.0f}% of the exact-mining "
                f"bound {bound:7.0f} pairs/s (time: {split}; {steps} updates; 75% of the bound leaves "
                f"{budget:.1f} ms an update, now {1000 * BATCH / pairs_s:.1f})"
                + (
                    f"; {100 * pairs_s / mining_bound(own_rate, m, mode == 'bitext'):.0f}% at bf16's rate"
                    if own_rate
                    else ""
                )
            )
    dtype = negatives.mining_dtype("auto", torch.device("cpu"))
    print(f"  (train.py's default --mine-precision auto mines in {str(dtype).removeprefix('torch.')} on this CPU)")


def mining(threads: int) -> None:
    n = M * BATCH
    torch.set_num_threads(threads)
    vectors = torch.randn(2 * n, DIM)
    groups = torch.arange(2 * n)
    for bitext in (False, True):
        flops = (
            2 * DIM * (n * n if bitext else 2 * n * n)
        )  # bitext: one n x n product; paraphrase: the 2n x 2n triangle
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            negatives.mine_hardest(vectors[: 2 * 2048], groups[: 2 * 2048], bitext, dtype)  # warm-up
            start = time.perf_counter()
            negatives.mine_hardest(vectors, groups, bitext, dtype)
            took = time.perf_counter() - start
            pool = "bitext" if bitext else "paraphrase"
            print(f"  {pool:10s} {name}: {took:6.2f} s per mega-batch of {n} pairs ({flops / took / 1e9:5.0f} GFLOP/s)")


def optimizer_steps(threads: int) -> None:
    """One update of train.LazyAdam (the rows in the batch) beside torch.optim.Adam over the whole table."""
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    rows = torch.from_numpy(np.unique(np.exp(rng.random(7000) * np.log(VOCAB - 3)).astype(np.int64) + 2))
    grad = torch.randn(len(rows), DIM)
    lazy = train.LazyAdam(torch.randn(VOCAB, DIM), 1e-3)
    dense = torch.nn.Parameter(torch.randn(VOCAB, DIM))
    adam = torch.optim.Adam([dense], 1e-3)

    def dense_step() -> None:
        dense.grad = torch.zeros_like(dense).index_add_(0, rows, grad)
        adam.step()

    states, touched = torch.randn(3, VOCAB, DIM), torch.empty(3, len(rows), DIM)

    def floor_step() -> None:
        for table, buffer in zip(states, touched, strict=True):
            torch.index_select(table, 0, rows, out=buffer)
            table.index_copy_(0, rows, buffer)

    steps = (("lazy Adam", lambda: lazy.step(rows, grad)), ("dense Adam", dense_step), ("floor", floor_step))
    for name, step in steps:
        step()
        start = time.perf_counter()
        for _ in range(5):
            step()
        print(f"  {name:11s}: {(time.perf_counter() - start) / 5 * 1000:7.1f} ms per step ({len(rows)} rows touched)")
    print("  (floor: only reading and writing back the touched rows of the weights and Adam's two moments, the")
    print("   memory traffic that any exact Adam update in fp32 has to pay, before any arithmetic)")


def peak_rss(folder: Path, small: Path, big: Path, sp_file: Path, threads: int | None) -> None:
    for label, shard in (("100k pairs", small), (f"{big.stem.removesuffix('-pairs')} pairs", big)):
        res = run_train(shard, sp_file, folder / f"rss-{shard.stem}", 2 * M, threads, M)
        print(f"  {label:12s}: peak RSS {res['rss_mib']:6.0f} MiB ({2 * M} updates and the final save)")


def window_reads(folder: Path, sp: bytes, pairs: int = 512_000, windows: int = 6) -> None:
    """The sampler's reads of whole windows (WINDOW_PAIRS pairs in randomly chosen blocks) from one shard, the
    first `windows` of an epoch: the host's time a window, which training waits for at every WINDOW_PAIRS pairs."""
    shard = folder / "windows.h5"
    write_synthetic_shard(shard, pairs, sp)
    sampler = PairSampler(ShardSet([shard], sp), seed=1)
    sampler.read(0, 0, 1)  # the epoch's plan, the file opened and its first window read: the others are timed
    seconds = []
    for w in range(1, windows + 1):
        start = time.perf_counter()
        sampler.read(0, w * WINDOW_PAIRS, 1)  # the first pair of window w: the window read whole
        seconds.append(time.perf_counter() - start)
    median = float(np.median(seconds))
    print(f"  {windows} windows of {WINDOW_PAIRS:,} pairs ({WINDOW_PAIRS // BLOCK_PAIRS:,} blocks of {BLOCK_PAIRS}) from "
          f"a {pairs:,}-pair shard: median {median:.3f} s a window (min {min(seconds):.3f}, max {max(seconds):.3f}), "
          f"{1e6 * median / WINDOW_PAIRS:.1f} us a pair; at 125,000 pairs/s an update's whole budget is 8.0 us a pair")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300, help="updates per throughput run (multiple of 100)")
    p.add_argument("--big-pairs", type=int, default=10_000_000, help="pairs in the large shard (RSS run)")
    p.add_argument("--threads", type=int, default=None, help="threads for train.py (default: all cores)")
    p.add_argument("--windows-only", action="store_true", help="only the sampler's window reads (seconds)")
    args = p.parse_args()
    threads = args.threads or torch.get_num_threads()
    print(machine_header())
    if args.windows_only:
        with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
            print("the sampler's windows, read from an HDF5 shard:")
            window_reads(Path(tmp), word_sentencepiece(Path(tmp)))
        return
    print(f"torch {torch.__version__}, {threads} threads; dim {DIM}, {VOCAB} pieces, batch {BATCH}, M = {M}")
    rate = matmul_rate(threads)
    print(
        f"fp32 matrix products ({negatives.MINE_CHUNK} x {DIM} by {DIM} x {negatives.MINE_CHUNK}): {rate / 1e9:.0f} GFLOP/s"
    )
    own_rate = None
    if negatives.mining_dtype("auto", torch.device("cpu")) == torch.bfloat16:  # the bound at the precision it mines in
        own_rate = matmul_rate(threads, torch.bfloat16)
        print(f"bf16 matrix products (the same shape; train.py mines in bf16 here): {own_rate / 1e9:.0f} GFLOP/s")
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        folder = Path(tmp)
        sp = word_sentencepiece(folder)
        sp_file = folder / "sp.model"
        sp_file.write_bytes(sp)
        small, big = folder / "100k.h5", folder / f"{args.big_pairs:,}-pairs.h5"
        write_synthetic_shard(small, 100_000, sp)
        print("train.py throughput (HDF5 shard, default flags):")
        throughput(folder, small, sp_file, args.steps, threads, rate, own_rate)
        print("mining one mega-batch (normalise, blocked matrix product, mask, argmax):")
        mining(threads)
        print(f"one optimizer step on the {VOCAB} x {DIM} table:")
        optimizer_steps(threads)
        print("the sampler's windows, read from an HDF5 shard:")
        window_reads(folder, sp)
        print("peak RSS of train.py by corpus size:")
        start = time.perf_counter()
        write_synthetic_shard(big, args.big_pairs, sp)
        print(f"  (wrote the {args.big_pairs}-pair shard in {time.perf_counter() - start:.0f} s)")
        peak_rss(folder, small, big, sp_file, threads)
    print(f"peak RSS of this script: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
