"""The last step of a recipe: centre a trained SP model's rows on a sample of its training sentences and whiten
them by the power that scores best on the dev sets (mean Pearson; `teacher.center_rows`), then save it in float16
(or --precision int8: a quarter of float32's bytes, for more pieces within the same file size). --sif-a A then
scales each row by A / (A + p(piece)), p counted on SENTENCES (SIF's weights: frequent pieces count less).
Given several trained models (one recipe run with different seeds), their tables are averaged first
(`teacher.average_rows`). Only dev sets choose; the powers tried and their dev figures are printed.

    python scripts/center_model.py TRAINED.pt [TRAINED2.pt ...] SENTENCES.txt OUT.pt --dev-file A.tsv B.tsv ...
        [--powers 0 0.1 0.2]
        [--config '{"multilingual": true}'] [--precision int8] [--sif-a 0.03]
"""

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import torch

from paraphrastic.cli import at_least
from paraphrastic.evaluate import score_sts_file
from paraphrastic.fileio import read_lines
from paraphrastic.models import from_checkpoint, load_model
from paraphrastic.options import STORED_PRECISIONS
from paraphrastic.teacher import average_rows, center_rows, piece_probabilities, sif_weights


def dev_mean(model, dev_files: list[Path]) -> float:
    return float(np.mean([score_sts_file(model, path)["pearson"] for path in dev_files]))


def stored(model, precision: str):
    """The model as it reads back from a file in `precision`: the dev sets judge what ships."""
    return model if precision == "float32" else from_checkpoint(model.checkpoint(precision=precision), Path("model"))


def weight_pieces(model, sentences: Path, a: float) -> None:
    """Scale each row by a / (a + p(piece)), p the piece's share of `sentences` once cut into pieces."""
    weights = sif_weights(piece_probabilities(model.tokenizer, sentences), a)
    with torch.no_grad():
        model.embedding.weight.mul_(torch.from_numpy(weights.astype(np.float32))[:, None])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", type=Path, nargs="+", help="the trained model(s) (e.g. train/best.pt), averaged")
    p.add_argument("sentences", type=Path, help="training sentences, one per line; 100,000 of them are sampled")
    p.add_argument("out", type=Path, help="where the float16 model is written")
    p.add_argument("--dev-file", type=Path, nargs="+", required=True, help="STS dev files (tsv) that choose")
    p.add_argument(
        "--powers", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], help="whitening powers"
    )
    p.add_argument("--config", type=json.loads, default={}, help="JSON object merged into the saved model's config")
    p.add_argument(
        "--precision",
        choices=STORED_PRECISIONS,
        default="float16",
        help="how the table is stored (default %(default)s)",
    )
    p.add_argument(
        "--sif-a",
        type=at_least(1e-12, float),
        help="after whitening, weight each row by A / (A + p(piece)) (default: not)",
    )
    args = p.parse_args()
    lines = read_lines(args.sentences)
    sample = [lines[i] for i in np.random.default_rng(0).choice(len(lines), min(100_000, len(lines)), replace=False)]
    averaged = average_rows([load_model(path) for path in args.models])
    best = None
    for power in args.powers:
        model = copy.deepcopy(averaged)
        center_rows(model, sample, whiten=power)
        score = dev_mean(stored(model, args.precision), args.dev_file)
        print(f"whitening power {power}: dev mean {score:.2f}", flush=True)
        if best is None or score > best[0]:
            best = (score, power, model)
    score, power, model = best
    model.config.update(centered=True, whitening=power, **args.config)
    if args.sif_a:
        weight_pieces(model, args.sentences, args.sif_a)
        score = dev_mean(stored(model, args.precision), args.dev_file)
        model.config.update(sif_after_training=args.sif_a)
        print(f"rows weighted by {args.sif_a} / ({args.sif_a} + p(piece)): dev mean {score:.2f}", flush=True)
    model.save(args.out, precision=args.precision)
    print(f"kept power {power} (dev mean {score:.2f}): {args.out}")


if __name__ == "__main__":
    main()
