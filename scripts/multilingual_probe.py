"""A smaller version of the multilingual model's training data, for the dev probes that chose its recipe: the
first N monolingual sentences per language (0: none), all the bitext, the first N English sentences, with
their targets, from a finished run's text, sentencepiece model and cached teacher vectors. PCA and the
starting table are fitted on the probe's own targets.

    python scripts/multilingual_probe.py runs/multilingual runs/probe-50k 50000
then train with scripts/train_multilingual_model.sh's paraphrastic-train line on PROBE/distill.txt and
PROBE/targets.npy, and compare with scripts/multilingual_dev.py.
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from paraphrastic.fileio import read_lines
from paraphrastic.models import SPModel, Tokenizer
from paraphrastic.teacher import (
    USE_TEACHER,
    encode_cached,
    fit_pca,
    initial_table,
    load_teacher,
    piece_probabilities,
    piece_texts,
    save_npy,
)

LANGS = ("ar", "de", "es", "fr", "ru", "tr", "zh")

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="the full run's folder (text, sp.model)")
    p.add_argument("probe", type=Path, help="the probe's folder")
    p.add_argument("sentences", type=int, help="monolingual and English sentences per language")
    p.add_argument("--dim", type=int, default=300)
    args = p.parse_args()
    args.probe.mkdir(parents=True, exist_ok=True)
    teacher = load_teacher(USE_TEACHER)
    pairs = [line.split("\t") for line in read_lines(args.run / "bitext.tsv")]
    english_sides = encode_cached(teacher, USE_TEACHER, [pair[0] for pair in pairs])
    texts, vectors = [], []
    for name in [f"mono.{lang}.txt" for lang in LANGS]:
        lines = read_lines(args.run / name)[: args.sentences]
        texts += lines
        vectors.append(encode_cached(teacher, USE_TEACHER, lines))
    texts += [pair[1] for pair in pairs] + [pair[0] for pair in pairs]
    vectors += [english_sides, english_sides]
    lines = read_lines(args.run / "en.txt")[: args.sentences]
    texts += lines
    vectors.append(encode_cached(teacher, USE_TEACHER, lines))
    raw = np.concatenate(vectors)
    (args.probe / "distill.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    tokenizer = Tokenizer((args.run / "sp.model").read_bytes(), lowercase=True)
    pieces = encode_cached(teacher, USE_TEACHER, piece_texts(tokenizer)).astype(np.float32)
    sample = np.random.default_rng(0).choice(len(raw), min(200_000, len(raw)), replace=False)
    pca = fit_pca(raw[sample].astype(np.float32), args.dim)
    table = initial_table(pieces, piece_probabilities(tokenizer, args.probe / "distill.txt"), pca, 1e-3)
    SPModel(tokenizer, torch.from_numpy(table), {"teacher": USE_TEACHER}).save(args.probe / "init.pt")
    targets = [(raw[i : i + 100_000].astype(np.float32) - pca[0]) @ pca[1] for i in range(0, len(raw), 100_000)]
    save_npy(args.probe / "targets.npy", np.concatenate(targets).astype(np.float16))
    print(f"{args.probe}: {len(texts)} sentences")
