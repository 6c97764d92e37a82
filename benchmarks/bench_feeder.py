"""The feeder's share: CPU time of the process that feeds the worker processes, against the run's wall time, for
`paraphrastic-embed` and `paraphrastic-score` with --threads workers on --lines lines (the fixed English sample).

    python benchmarks/bench_feeder.py [--lines 2000000] [--threads 2] [--encode 1000000]

The commands run as `python -m paraphrastic.embed_sentences` (so PYTHONPATH picks the code measured); the parent's
own user and system time is read from /proc every 20 ms until it exits (its workers' time is theirs), in all and from
the moment its workers start (the feeding, start-up aside). Then the end: the seconds from the workers' exit to the
command's (publishing the output: its fsync and rename). First, the plan of the input's blocks, which the parent
makes before any worker starts, on one thread and on --threads; last, the CPU time of `model.encode`'s caller (the
process that hands the workers their jobs) on --encode sentences, and its seconds before the first job.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from inspect import signature
from pathlib import Path

from common import ROOT, children, english_sentences, machine_header

from paraphrastic.fileio import line_plan
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
    """The fastest of `runs` plans of the input's blocks (fileio.line_plan) on `threads` threads (one in code from
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
model.encode(lines)
print(time.perf_counter() - wall, time.process_time() - cpu, first[0] - wall, len(lines))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--encode", type=int, default=1_000_000, help="sentences for model.encode")
    args = p.parse_args()
    print(machine_header())
    sentences = english_sentences()
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        text, pairs = Path(tmp) / "lines.txt", Path(tmp) / "pairs.txt"
        lines = [sentences[i % len(sentences)] for i in range(args.lines)]
        text.write_text("".join(line + "\n" for line in lines))
        pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(lines, lines[1:] + lines[:1], strict=True)))
        runs = {
            "embed": ["paraphrastic.embed_sentences", "--sentence-file", str(text), "--output-file", f"{tmp}/v.npy"],
            "score": ["paraphrastic.score_sentence_pairs", "--sentence-pair-file", str(pairs), "--output-file",
                      f"{tmp}/s.tsv"],
        }  # fmt: skip
        one, many = plan_seconds(text, 1), plan_seconds(text, args.threads)
        print(f"planning the input ({args.lines:,} lines, before any worker starts): {one:.3f} s on one thread, "
              f"{many:.3f} s on {args.threads}", flush=True)  # fmt: skip
        for name, cmd in runs.items():
            wall, cpu, feeding, fed, ending = parent_share(
                [sys.executable, "-m", *cmd, "--threads", str(args.threads), "--quiet"]
            )
            print(f"{name}, {args.lines:,} lines, --threads {args.threads}: {wall:.1f} s, the parent {cpu:.2f} s of CPU; "
                  f"from the workers' start: {feeding:.1f} s, the parent {fed:.2f} s of CPU ({fed / feeding:.1%} of a "
                  f"core); from the workers' exit to the command's: {ending:.2f} s", flush=True)  # fmt: skip
        done = subprocess.run([sys.executable, "-c", ENCODE, str(text), str(args.encode), str(args.threads)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        wall, cpu, before, count = map(float, done.stdout.split())  # count: at most --lines, the file's
        print(f"model.encode, {count:,.0f} sentences, {args.threads} workers: {wall:.2f} s, the caller {cpu:.2f} s of "
              f"CPU ({cpu / wall:.1%} of a core), {before:.2f} s before its first job (the workers wait)")  # fmt: skip


if __name__ == "__main__":
    main()
