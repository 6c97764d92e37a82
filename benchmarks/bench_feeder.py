"""The feeder's share: CPU time of the process that feeds the worker processes, against the run's wall time, for
`paraphrastic-embed` and `paraphrastic-score` with --threads workers on --lines lines (the fixed English sample).

    python benchmarks/bench_feeder.py [--lines 2000000] [--threads 2]

The commands run as `python -m paraphrastic.embed_sentences` (so PYTHONPATH picks the code measured); the parent's
own user and system time is read from /proc every 20 ms until it exits (its workers' time is theirs), in all and from
the moment its workers start (the feeding, start-up aside). Then the end: the seconds from the workers' exit to the
command's (publishing the output: its fsync and rename).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, children, english_sentences, machine_header

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--threads", type=int, default=2)
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
        for name, cmd in runs.items():
            wall, cpu, feeding, fed, ending = parent_share(
                [sys.executable, "-m", *cmd, "--threads", str(args.threads), "--quiet"]
            )
            print(f"{name}, {args.lines:,} lines, --threads {args.threads}: {wall:.1f} s, the parent {cpu:.2f} s of CPU; "
                  f"from the workers' start: {feeding:.1f} s, the parent {fed:.2f} s of CPU ({fed / feeding:.1%} of a "
                  f"core); from the workers' exit to the command's: {ending:.2f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
