"""Training throughput on 1 process against 2 torchrun ranks on CPU (gloo), at the same run batch, on real pairs.

    python benchmarks/bench_ddp.py [--pairs 50000] [--steps 600] [--data ../shared/data]

Takes the first --pairs Multi30k caption pairs, trains an 8,000-piece sentencepiece model on them once, then
runs train.py (dim 300, 128 pairs per update, M = 1 and M = 10 from the start) as 1 process with 1 thread, 1
process with 2 threads, and torchrun with 2 ranks x 64 pairs x 1 thread, rank-local and --global-megabatch
mining. Prints pairs/s from rank 0's metrics.jsonl (mean of the windows of 100 updates after the first, which
includes warm-up). On a 2-core machine this compares ways of using the same 2 cores, not scaling.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from paraphrastic import pieces

ROOT = Path(__file__).resolve().parents[1]

CAPTIONS = "train/en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz"
SETUPS = [  # (label, ranks, threads per rank, extra arguments)
    ("1 process, 1 thread", 1, 1, []),
    ("1 process, 2 threads", 1, 2, []),
    ("2 ranks x 1 thread, rank-local mining", 2, 1, []),
    ("2 ranks x 1 thread, --global-megabatch", 2, 1, ["--global-megabatch"]),
]


def first_pairs(source: Path, n: int, folder: Path) -> tuple[Path, Path]:
    """The first n pairs as a TSV, and an 8,000-piece sentencepiece model trained on their sentences."""
    with gzip.open(source, "rt", encoding="utf-8") as f:
        lines = list(itertools.islice(f, n))
    pairs, text = folder / "pairs.tsv", folder / "text.txt"
    pairs.write_text("".join(lines), encoding="utf-8")
    text.write_text("".join(s.lower() + "\n" for line in lines for s in line.rstrip("\n").split("\t")))
    sp = folder / "sp.model"
    sp.write_bytes(pieces.train_sentencepiece(text, 8000, 2))
    return pairs, sp


def pairs_per_second(pairs: Path, sp: Path, out: Path, ranks: int, threads: int, extra: list[str], args) -> float:
    """Run train.py as a user would (under torchrun for 2 ranks); mean pairs/s after the first window."""
    cmd = [sys.executable]
    if ranks > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    cmd += [str(ROOT / "train.py"), "--train-file", str(pairs), "--sp-model", str(sp), "--output-dir", str(out)]
    cmd += ["--dim", "300", "--batch-size", str(128 // ranks), "--megabatch-anneal", "0", "--lr", "0.003"]
    cmd += ["--max-steps", str(args.steps), "--log-every", "100", "--threads", str(threads), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"train.py failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["pairs_per_s"] for r in records if r["event"] == "train"][1:]
    return sum(rates) / len(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=50_000, help="caption pairs to train on (default 50000)")
    p.add_argument("--steps", type=int, default=600, help="updates per run, a multiple of 100 (default 600)")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data", help="the shared data folder")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        folder = Path(tmp)
        pairs, sp = first_pairs(args.data / CAPTIONS, args.pairs, folder)
        print(f"{args.pairs} caption pairs, dim 300, 8000 pieces, 128 pairs per update, {args.steps} updates")
        print(f"load average before: {os.getloadavg()[0]:.1f} (other jobs on the machine skew the figures)")
        for m in (1, 10):
            for k, (label, ranks, threads, extra) in enumerate(SETUPS):
                out = folder / f"run-m{m}-{k}"
                rate = pairs_per_second(pairs, sp, out, ranks, threads, ["--megabatch-size", str(m), *extra], args)
                print(f"  M = {m:2d}  {label:40s} {rate:8.0f} pairs/s", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
