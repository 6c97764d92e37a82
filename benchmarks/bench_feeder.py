"""The feeder's share: CPU time of the process that feeds the worker processes, against the run's wall time, for
`paraphrastic-embed` and `paraphrastic-score` with --threads workers on --lines lines (the fixed English sample).

    python benchmarks/bench_feeder.py [--lines 2000000] [--threads 2] [--encode 1000000]

The commands run as `python -m paraphrastic.embed_sentences` (so PYTHONPATH picks the code measured); the parent's
own user and system time is read from /proc every 20 ms until it exits (its workers' time is theirs), in all and from
the moment its workers start (the feeding, start-up aside). Then the end: the seconds from the workers' exit to the
command's (the output is published, its fsync and rename, before they are let go). Before all, what of that fsync is
left when the output is written at --write-rate while `fileio.flushing` syncs its pages every second or every quarter
of one. Then the CPU time of one worker's job, embed's and score's, on one thread (--jobs runs). First of the runs,
the plan of the input's blocks, which the parent makes while its workers start, on one thread and on --threads;
last, the CPU time of `model.encode`'s caller (the process that hands the workers their jobs) on --encode sentences
(0: left out), and its seconds before the first job.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from inspect import signature
from pathlib import Path

from common import ROOT, children, english_sentences, machine_header, write_repeated

from paraphrastic import fileio
from paraphrastic.blocks import line_plan
from paraphrastic.workers import process_cpu


def parent_share(cmd: list[str]) -> tuple[float, float, float, float, float]:
    """(wall seconds, the parent process's own CPU seconds; both again from its workers' start, when the start-up
    (imports, the model) is over and the feeding begins; the seconds from the workers' exit to the command's) of a
    command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu, forked, gone = 0.0, None, None
    while proc.poll() is None:
        cpu = process_cpu(proc.pid) or cpu
        working = bool(children(proc.pid))
        if forked is None and working:
            forked = (time.perf_counter(), cpu)
        gone = None if working else gone or time.perf_counter()
        time.sleep(0.02)
    if proc.returncode != 0 or forked is None:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.read()[-2000:]}")
    end = time.perf_counter()
    return end - start, cpu, end - forked[0], cpu - forked[1], end - (gone or end)


def plan_seconds(text: Path, threads: int, runs: int = 5) -> float:
    """The fastest of `runs` plans of the input's blocks (blocks.line_plan) on `threads` threads (one in code from
    before the plan in parts), the file cached."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        line_plan(text, 16384, **({"threads": threads} if "threads" in signature(line_plan).parameters else {}))
        times.append(time.perf_counter() - start)
    return min(times)


ENCODE = """
import sys, time
from paraphrastic import models, workers
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()[: int(sys.argv[2])]
workers.use_threads(int(sys.argv[3]))
model = models.load_model()
model.encode(lines[:30_000])  # a first pool and torch's import, apart
first = []  # when the caller hands out its first job: what it does before that, the workers wait for
jobs = workers.Workers.map
workers.Workers.map = lambda self, fn, todo: first.append(time.perf_counter()) or jobs(self, fn, todo)
cpu, wall = time.process_time(), time.perf_counter()
rows = model.encode(lines)  # kept until the clock stops: freeing them is the caller's, later (bench_cores.py)
print(time.perf_counter() - wall, time.process_time() - cpu, first[0] - wall, len(lines))
"""

JOBS = """
import sys, time
import numpy as np
from pathlib import Path
from paraphrastic import load_encoder, workers
from paraphrastic.embed_sentences import embed_job
from paraphrastic.score_sentence_pairs import score_job
text, pairs, runs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
workers.use_threads(1)  # as in a worker: one thread
model = load_encoder()
out = np.lib.format.open_memmap(sys.argv[4], mode="w+", dtype="float32", shape=(16384, model.dim))
def block(path):  # the bytes of the first 16,384 lines, as a worker's (offset, length)
    data = path.read_bytes()[: 16 << 20]
    return 0, sum(map(len, data.splitlines(keepends=True)[:16384]))
jobs = {"embed": (embed_job, (text, 1, block(text), False, 8192, sys.argv[4], 0, "float32")),
        "score": (score_job, (pairs, 1, block(pairs), False, False, 8192))}
for name, (job, args) in jobs.items():
    job(model, args)
    cpu = []
    for _ in range(runs):
        start = time.process_time()
        job(model, args)
        cpu.append(time.process_time() - start)
    print(name, 1000 * min(cpu), 1000 * float(np.median(cpu)))
"""


def fsync_left(folder: Path, rate: float, seconds: float, every: float) -> float:
    """Seconds the fsync that publishes an output waits, after `seconds` of writing it at `rate` bytes/s (4 MiB
    at a time, as the workers' rows arrive) while `fileio.flushing` syncs its pages every `every` seconds."""
    path, block = folder / "written.bin", os.urandom(4 << 20)
    with open(path, "wb") as f:
        with fileio.flushing(path, every):  # as embed's output: the flushing thread is joined, then the file synced
            start, written = time.perf_counter(), 0
            while written < rate * seconds:
                written += f.write(block)
                time.sleep(max(0.0, written / rate - (time.perf_counter() - start)))
            f.flush()
            start = time.perf_counter()
        os.fsync(f.fileno())
        left = time.perf_counter() - start
    path.unlink()
    return left


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--encode", type=int, default=1_000_000, help="sentences for model.encode (0: leave it out)")
    p.add_argument("--jobs", type=int, default=30, help="runs of one worker's job, embed's and score's (0: leave out)")
    p.add_argument("--write-rate", type=float, default=760.0,
                   help="MB/s of the output's writing for the fsync left at its end (embed on 16 cores: 760)")  # fmt: skip
    args = p.parse_args()
    print(machine_header())
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:  # the repo's disk, as the runs below
        for every in (1.0, 0.25):
            left = statistics.median(fsync_left(Path(tmp), args.write_rate * 1e6, 2.5, every) for _ in range(3))
            print(f"the fsync that publishes an output written at {args.write_rate:,.0f} MB/s for 2.5 s, its pages "
                  f"synced every {every} s meanwhile: {left:.3f} s (median of 3)", flush=True)  # fmt: skip
    sentences = english_sentences()
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        text, pairs = Path(tmp) / "lines.txt", Path(tmp) / "pairs.txt"
        lines = write_repeated(text, sentences, args.lines)
        pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(lines, lines[1:] + lines[:1], strict=True)))
        runs = {
            "embed": ["paraphrastic.embed_sentences", "--sentence-file", str(text), "--output-file", f"{tmp}/v.npy"],
            "score": ["paraphrastic.score_sentence_pairs", "--sentence-pair-file", str(pairs), "--output-file",
                      f"{tmp}/s.tsv"],
        }  # fmt: skip
        if args.jobs:
            done = subprocess.run([sys.executable, "-c", JOBS, str(text), str(pairs), str(args.jobs), f"{tmp}/rows.npy"],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            for line in done.stdout.splitlines():
                name, least, middle = line.split()
                print(f"a worker's {name} job (16,384 lines, one thread): {float(least):.1f} ms of CPU at least, "
                      f"{float(middle):.1f} ms the median of {args.jobs}", flush=True)  # fmt: skip
        one, many = plan_seconds(text, 1), plan_seconds(text, args.threads)
        print(f"planning the input ({args.lines:,} lines, while the workers start): {one:.3f} s on one thread, "
              f"{many:.3f} s on {args.threads}", flush=True)  # fmt: skip
        for name, cmd in runs.items():
            wall, cpu, feeding, fed, ending = parent_share(
                [sys.executable, "-m", *cmd, "--threads", str(args.threads), "--quiet"]
            )
            print(f"{name}, {args.lines:,} lines, --threads {args.threads}: {wall:.1f} s, the parent {cpu:.2f} s of CPU; "
                  f"from the workers' start: {feeding:.1f} s, the parent {fed:.2f} s of CPU ({fed / feeding:.1%} of a "
                  f"core); from the workers' exit to the command's: {ending:.2f} s", flush=True)  # fmt: skip
        if not args.encode:
            return
        done = subprocess.run([sys.executable, "-c", ENCODE, str(text), str(args.encode), str(args.threads)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        wall, cpu, before, count = map(float, done.stdout.split())  # count: at most --lines, the file's
        print(f"model.encode, {count:,.0f} sentences, {args.threads} workers: {wall:.2f} s, the caller {cpu:.2f} s of "
              f"CPU ({cpu / wall:.1%} of a core), {before:.2f} s before its first job (the workers wait)")  # fmt: skip


if __name__ == "__main__":
    main()
