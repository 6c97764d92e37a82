"""The English dev figures that choose the default model, with the STS Benchmark dev set split into its three parts
(in file order: captions, lines 1-625; forum answers, 626-1000, StackExchange text like STS 2016's answers and
questions; news, 1001-1500). The forum part is where a static student lags its teacher. With the WMT systems' data
in DATA_DIR, wmt-err: the error rate x 100 of retrieval within the held-apart WMT test sets' groups (each group's
reference against its paraphrase that shares the fewest words; `preprocess.wmt.dev_pairs`, both directions; no
sentence the default was trained on), the
registers of news, conversation and social text that no STS dev set holds. No test set is read.

    python scripts/dev_parts.py MODEL [MODEL ...] [--data-dir ../shared/data]
"""

import argparse
import os
from pathlib import Path

import numpy as np
from teacher_dev import PARTS, dev_sets, wmt_dev_pairs

from paraphrastic.evaluate import correlations, embed_unique, pair_cosines, retrieval_errors
from paraphrastic.models import load_model
from paraphrastic.preprocess import wmt


def dev_figures(model, data: Path) -> dict[str, float]:
    """Pearson x 100 of each dev set, their mean, and each part of the STS Benchmark dev set."""
    sets = dev_sets(data)  # the same sets, read the same way, as the teachers' dev figures
    cos = pair_cosines(model, sets)
    out = {k: correlations(cos[k], sets[k].gold)["pearson"] for k in sets}
    out["mean"] = float(np.mean(list(out.values())))
    gold = sets["stsb-dev"].gold
    for name, part in PARTS.items():
        out[name] = correlations(cos["stsb-dev"][part], gold[part])["pearson"]
    if (data / wmt.GROUPS).exists():
        out["wmt-err"] = wmt_error(model, data)
    return out


def wmt_error(model, data: Path) -> float:
    """Mean error rate x 100 of retrieval, both ways, over the held-apart WMT groups' pairs."""
    pairs = wmt_dev_pairs(data)
    vectors, rows = embed_unique(model, [a for a, _ in pairs] + [b for _, b in pairs])
    return float(np.mean(retrieval_errors(vectors[rows[: len(pairs)]], vectors[rows[len(pairs) :]])))


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
    names = ["sts17-en", "stsb-dev", "sts12-train", "mean", *PARTS, "wmt-err"]
    print("| model | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
    for name in args.models:
        figures = dev_figures(load_model(name), args.data_dir)
        print(f"| {name} | " + " | ".join(f"{figures.get(k, float('nan')):.2f}" for k in names) + " |")


if __name__ == "__main__":
    main()
