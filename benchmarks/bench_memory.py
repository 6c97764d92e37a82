"""Memory bounded by bytes: the peak RSS of `paraphrastic-embed --threads 2` (the command and its workers) on a file
of lines near the line limit and on a file of many short lines.

    python benchmarks/bench_memory.py [--long-lines 24] [--short-lines 2000000] [--threads 2]

The long lines are the fixed English sentence sample of ../shared/data joined by spaces into lines of --line-mib
MiB (just under the 16 MiB limit by default); the short lines are the sample's sentences, repeated as needed. The
process tree is read every 50 ms: "peak RSS" is the largest sum of VmRSS seen at one moment, and "bound" the sum of
each process's own high-water mark (VmHWM), which no moment of the run can exceed. The target is under 2 GiB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, children, english_sentences, machine_header, write_repeated

BIN = Path(sys.executable).parent


def status_kib(pid: int, field: str) -> int:
    """A VmRSS-style field of /proc/PID/status in KiB (0 once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(field + ":")), 0)


def peak_memory(cmd: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak of the tree's summed RSS, sum of every process's own peak), in KiB, of a command that
    must succeed."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, own = 0, {}
    while proc.poll() is None:
        tree = [proc.pid, *children(proc.pid)]
        peak = max(peak, sum(status_kib(p, "VmRSS") for p in tree))
        for p in tree:
            own[p] = max(own.get(p, 0), status_kib(p, "VmHWM"))
        time.sleep(0.05)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.read()[-2000:]}")
    return time.perf_counter() - start, peak, sum(own.values())


def write_long_lines(path: Path, lines: int, mib: float, sentences: list[str]) -> None:
    """`lines` lines of about `mib` MiB each: the sentences in order, joined by spaces, repeated as needed."""
    size, at = int(mib * (1 << 20)), 0
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            line, length = [], 0
            while length < size:
                sentence = sentences[at % len(sentences)]
                line.append(sentence)
                length += len(sentence.encode()) + 1
                at += 1
            f.write(" ".join(line).encode()[: size - 1].decode("utf-8", "ignore") + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--long-lines", type=int, default=24, help="lines near the limit")
    p.add_argument("--line-mib", type=float, default=15.5, help="MiB per long line (the limit is 16)")
    p.add_argument("--short-lines", type=int, default=2_000_000, help="short lines")
    p.add_argument("--threads", type=int, default=2, help="the command's --threads")
    args = p.parse_args()
    print(machine_header())
    sentences = english_sentences()
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        tmp = Path(tmp)
        long, short = tmp / "long.txt", tmp / "short.txt"
        write_long_lines(long, args.long_lines, args.line_mib, sentences)
        write_repeated(short, sentences, args.short_lines)
        for name, text in (
            (f"{args.long_lines} lines of {args.line_mib} MiB", long),
            (f"{args.short_lines:,} short lines", short),
        ):
            cmd = [str(BIN / "paraphrastic-embed"), "--sentence-file", str(text), "--output-file",
                   str(tmp / "out.npy"), "--threads", str(args.threads), "--quiet"]  # fmt: skip
            seconds, peak, bound = peak_memory(cmd)
            mib = text.stat().st_size / (1 << 20)
            print(f"{name} ({mib:,.0f} MiB of text), --threads {args.threads}: peak RSS {peak / 1024:,.0f} MiB "
                  f"(bound {bound / 1024:,.0f} MiB), {seconds:.1f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
