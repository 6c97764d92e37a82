"""The dev figures that choose the multilingual model: English STS dev sets (STS 2017 en-en, STS Benchmark dev,
STS 2012 train; Pearson x 100) and retrieval error x 100 on the held-apart bitext pairs that
scripts/multilingual_text.py cut per language: each foreign sentence looks for its English side among those
300 and 20,000 English Wikipedia sentences the model never trained on (lines 200,000-220,000 of
train/en_text/enwiki_2018_articles.txt.gz), which makes the task hard enough to tell models apart. No test set
is read.

    python scripts/multilingual_dev.py MODEL [MODEL ...] --heldout runs/multilingual [--data-dir ../shared/data]
"""

import argparse
import gzip
import itertools
import os
from pathlib import Path

import numpy as np

from paraphrastic import knn
from paraphrastic.evaluate import score_sts_file
from paraphrastic.fileio import read_lines
from paraphrastic.models import load_model


def distractors(data: Path, start: int = 200_000, count: int = 20_000) -> list[str]:
    with gzip.open(data / "train" / "en_text" / "enwiki_2018_articles.txt.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in itertools.islice(f, start, start + count)]


def dev_figures(model, heldout: Path, data: Path) -> dict[str, float]:
    sts = {
        "sts17-en": data / "sts" / "2017" / "en-en.tsv",
        "stsb-dev": data / "sts" / "en" / "stsb" / "dev.tsv",
        "sts12-train": heldout / "sts12-train.tsv",
    }
    out = {name: score_sts_file(model, path)["pearson"] for name, path in sts.items()}
    out["sts-mean"] = float(np.mean(list(out.values())))
    extra = model.encode(distractors(data))
    for path in sorted(heldout.glob("heldout.*.tsv")):
        en, xx = zip(*(line.split("\t") for line in read_lines(path)), strict=True)
        keys = np.concatenate([model.encode(list(en)), extra])
        found, _ = knn.nearest_both_ways(model.encode(list(xx)), keys)
        out[path.stem.split(".")[1]] = 100 * float(np.mean(found != np.arange(len(xx))))
    errors = [v for k, v in out.items() if len(k) == 2]
    if errors:
        out["error-mean"] = float(np.mean(errors))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="model files or shipped names")
    p.add_argument("--heldout", type=Path, required=True, help="folder of heldout.<lang>.tsv and sts12-train.tsv")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PARAPHRASTIC_DATA", "../shared/data")))
    args = p.parse_args()
    for name in args.models:
        figures = dev_figures(load_model(name), args.heldout, args.data_dir)
        print(name, " ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
