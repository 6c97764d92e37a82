"""The encoder comparison table: quality (from each run's eval.json) and embedding speed, one row each.

Reads the runs of scripts/compare_encoders.sh (runs/compare/<name>/best.pt, eval.json, metrics.jsonl).
Speed protocol: 20,000 English sentences from ../shared/data (fixed choice) sorted by length, raw text
in, vectors out, batch 1024, one thread, median of 3 runs after a warm-up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from bench_embed import median_seconds
from common import ROOT, machine_header, sentence_sample

from paraphrastic.models import load_model

YEARS = ("2012", "2013", "2014", "2015", "2016")


def quality(run: Path) -> list[float]:
    """STS 2012-2016 per year and average, STS Benchmark dev, and the best STS 2017 en-en (the selection set)."""
    figures = json.loads((run / "eval.json").read_text())
    sts = figures["sts"]
    best = max(r["mean"] for r in map(json.loads, (run / "metrics.jsonl").open()) if r["event"] == "dev")
    years = [sts["years"][y]["pearson"] for y in YEARS]
    return [*years, sts["avg"]["pearson"], figures["stsb"]["sets"]["dev"]["pearson"], best]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "compare")
    p.add_argument("--sentences", type=int, default=20_000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()

    torch.set_num_threads(1)
    sentences = sorted(sentence_sample(args.sentences), key=len)
    runs = sorted(d for d in args.runs_dir.iterdir() if (d / "eval.json").exists())
    print(machine_header())
    print(f"speed: {len(sentences)} sentences sorted by length, batch 1024, 1 thread, median of {args.runs}\n")
    print("| encoder | dim | " + " | ".join(YEARS) + " | STS12-16 avg | STSb dev | STS17 en-en (dev) | sent/s |")
    print("|---" * 11 + "|")
    for run in runs:
        model = load_model(run / "best.pt")
        seconds = median_seconds(lambda m=model: m.embed_raw_text(sentences, batch_size=1024), args.runs)
        row = " | ".join(f"{x:.1f}" for x in quality(run))
        print(f"| {run.name} | {model.dim} | {row} | {len(sentences) / seconds:,.0f} |")


if __name__ == "__main__":
    main()
