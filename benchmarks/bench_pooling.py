"""When torch's pooling kernel repays its import: the rule behind `static.TORCH_FROM`.

    python benchmarks/bench_pooling.py [--shares 1000000,2000000] [--workers 2] [--runs 3]

`paraphrastic-embed` pools with scipy's sparse product, and imports torch for its embedding_bag (the same bits)
only where a worker's share of the input is at least TORCH_FROM texts. First, in a process without torch: the
shipped model's pooling per text with scipy, torch's import, then its pooling per text, and the share from which
the kernel alone would repay the import. Then the whole command, --workers workers on shares of each size, with
torch for every share (TORCH_FROM = 0) and for none (never), in turn, --runs times: what the rule decides.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, english_sentences, machine_header, write_repeated

from paraphrastic import static

RUN = """import sys
from paraphrastic import static
static.TORCH_FROM = int(sys.argv[1])
from paraphrastic.embed_sentences import main
sys.exit(main(sys.argv[2:]))
"""

KERNELS = """import sys, time
import paraphrastic
from paraphrastic import static
assert "torch" not in sys.modules
model = paraphrastic.load_encoder()
texts = open(sys.argv[1], encoding="utf-8").read().splitlines()
bags = [static.sp_rows(*model.token_ids(texts[i : i + 8192]), model.piece_rows, model.unk_row)
        for i in range(0, len(texts), 8192)]

def seconds():
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for flat, lengths in bags:
            static.mean_rows(model.table, flat, lengths)
        times.append(time.perf_counter() - start)
    return min(times) / len(texts)

scipy_s = seconds()
start = time.perf_counter()
static.use_torch_for(static.TORCH_FROM)
imported = time.perf_counter() - start
print(model.dim, len(texts), scipy_s, seconds(), imported)
"""


def command_seconds(text: Path, out: Path, workers: int, torch_from: int) -> float:
    """Wall seconds of the whole embed command on `text` with `workers` workers and TORCH_FROM = `torch_from`."""
    out.unlink(missing_ok=True)  # replacing a large file frees its blocks in the rename: not this run's cost
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN, str(torch_from), "--sentence-file", str(text), "--output-file",
                    str(out), "--threads", str(workers), "--quiet"], check=True, capture_output=True)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shares", default="1000000,2000000", help="texts a worker pools, comma-separated")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    print(machine_header())
    sentences = english_sentences()
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        sample = Path(tmp) / "sample.txt"
        sample.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        done = subprocess.run([sys.executable, "-c", KERNELS, str(sample)], capture_output=True, text=True, check=True)
        dim, texts, scipy_s, torch_s, imported = (float(x) for x in done.stdout.split())
        print(f"the shipped model (dim {dim:.0f}), {texts:,.0f} texts, in a process without torch: pooling "
              f"{scipy_s * 1e6:.2f} us a text with scipy, {torch_s * 1e6:.2f} us with torch, whose import took "
              f"{imported:.2f} s: the kernel repays it from {imported / (scipy_s - torch_s):,.0f} texts (the "
              f"command's import also delays its workers' start); TORCH_FROM is {static.TORCH_FROM:,}")  # fmt: skip
        for share in (int(s) for s in args.shares.split(",") if s):
            text, out, lines = Path(tmp) / "lines.txt", Path(tmp) / "out.npy", share * args.workers
            write_repeated(text, sentences, lines)
            runs = [(command_seconds(text, out, args.workers, 0), command_seconds(text, out, args.workers, 10**18))
                    for _ in range(args.runs)]  # fmt: skip
            with_torch, without = (statistics.median(r[k] for r in runs) for k in range(2))
            ratio = statistics.median(a / b for a, b in runs)
            print(f"  {lines:,} lines, {args.workers} workers ({share:,} a worker): {with_torch:.2f} s with torch, "
                  f"{without:.2f} s without (medians of {args.runs}, in turn; with / without {ratio:.3f})",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
