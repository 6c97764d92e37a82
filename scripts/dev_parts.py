"""The English dev figures that choose the default model, with the STS Benchmark dev set split into its three parts
(in file order: captions, lines 1-625; forum answers, 626-1000, StackExchange text like STS 2016's answers and
questions; news, 1001-1500). The forum part is where a static student lags its teacher. No test set is read.

    python scripts/dev_parts.py MODEL [MODEL ...] [--data-dir ../shared/data]
"""

import argparse
import os
from pathlib import Path

import numpy as np
from teacher_dev import PARTS, dev_sets

from paraphrastic.evaluate import correlations, pair_cosines
from paraphrastic.models import load_model


def dev_figures(model, data: Path) -> dict[str, float]:
    """Pearson x 100 of each dev set, their mean, and each part of the STS Benchmark dev set."""
    sets = dev_sets(data)  # the same sets, read the same way, as the teachers' dev figures
    cos = pair_cosines(model, sets)
    out = {k: correlations(cos[k], sets[k].gold)["pearson"] for k in sets}
    out["mean"] = float(np.mean(list(out.values())))
    gold = sets["stsb-dev"].gold
    for name, part in PARTS.items():
        out[name] = correlations(cos["stsb-dev"][part], gold[part])["pearson"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="model files or names (default, multilingual)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("PARAPHRASTIC_DATA", "../shared/data")),
        help="(default %(default)s)",
    )
    args = p.parse_args()
    names = ["sts17-en", "stsb-dev", "sts12-train", "mean", *PARTS]
    print("| model | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
    for name in args.models:
        figures = dev_figures(load_model(name), args.data_dir)
        print(f"| {name} | " + " | ".join(f"{figures[k]:.2f}" for k in names) + " |")


if __name__ == "__main__":
    main()
