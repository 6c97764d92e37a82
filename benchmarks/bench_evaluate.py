"""Time `evaluate.py --tasks sts,sts17,stsb,sick,tatoeba` on a 50,000-piece x 1024-dim model (target < 30 s).

    python benchmarks/bench_evaluate.py [--data-dir ../shared/data] [--all-langs]

The sentencepiece model is trained once on the English sentences of the shared training data (caption
pairs, ASSET, English sides of the bitext) and cached in benchmarks/.cache/; the embedding table is random, since timing does not depend on the values. Each figure is the
wall time of a fresh `python evaluate.py ...` process, model loading and interpreter start included.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import DATA, ROOT, machine_header, sp_model_50k

from paraphrastic import models
from paraphrastic.options import TASKS

DIM = 1024


def time_cli(args: list[str]) -> tuple[float, str]:
    """Wall time of one fresh evaluate.py process, and its output."""
    start = time.perf_counter()
    run = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        sys.exit(f"evaluate.py failed ({run.returncode}): {run.stderr.strip()}")
    return seconds, run.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=DATA)
    p.add_argument("--all-langs", action="store_true", help="also time Tatoeba --langs all (112 languages)")
    args = p.parse_args()
    tokenizer = models.Tokenizer(sp_model_50k(), lowercase=True)
    print(machine_header())
    torch.manual_seed(0)
    model = models.SPModel(tokenizer, torch.randn(len(tokenizer), DIM))
    with tempfile.TemporaryDirectory() as tmp:
        model_file = Path(tmp) / "bench.pt"
        model.save(model_file)
        print(f"{model!r}, file {os.path.getsize(model_file) / 2**20:.0f} MiB, torch threads {torch.get_num_threads()}")
        common = ["--load-file", str(model_file), "--data-dir", str(args.data_dir)]
        seconds, out = time_cli(common + ["--tasks", ",".join(TASKS), "--json", str(Path(tmp) / "r.json")])
        print(out.strip().splitlines()[-1])
        print(f"full evaluation (--tasks {','.join(TASKS)}): {seconds:.1f} s wall (target < 30 s)")
        if args.all_langs:
            seconds, _ = time_cli(common + ["--tasks", "tatoeba", "--langs", "all"])
            print(f"Tatoeba --langs all (112 languages): {seconds:.1f} s wall")


if __name__ == "__main__":
    main()
