"""Tatoeba's error x 100 on the test pairs near the Tatoeba-Challenge bitext and on those far from it: a model
trained on that bitext (CHALLENGE=1) is read on both parts, so that what it gained from near copies of the test
sentences is told apart from what it learnt. A test pair is near when either side's character trigrams overlap a
Challenge sentence's of its language by at least --near (Jaccard; multilingual_text.py drops Challenge pairs at 0.5
and over from the training text); every pair is still retrieved among all 1,000 of its language.

    python scripts/tatoeba_near.py MODEL [MODEL ...] [--data-dir ../shared/data] [--near 0.3]
"""

import argparse
import os
from pathlib import Path

import numpy as np
from multilingual_text import TATOEBA, NearTest, bitext_pairs, challenge_file, read_test  # sibling scripts

from paraphrastic import knn
from paraphrastic.models import load_model


def near_pairs(data: Path, lang: str, near: float) -> np.ndarray:
    """Whether each test pair of `lang` has a side near a Challenge sentence of that language."""
    test = TATOEBA[lang][1]
    pairs = bitext_pairs(challenge_file(data, lang))
    english, foreign = NearTest([en for en, _ in pairs]), NearTest([xx for _, xx in pairs])
    sides = zip(read_test(data, test, "eng"), read_test(data, test, test), strict=True)
    return np.array([max(english.closest(en), foreign.closest(xx)) >= near for en, xx in sides])


def errors(model, data: Path, lang: str) -> np.ndarray:
    """Each test pair's error, the mean of its two directions (foreign to English, English to foreign)."""
    test = TATOEBA[lang][1]
    xx, en = (model.encode(read_test(data, test, side)) for side in (test, "eng"))
    to_en, to_xx = knn.nearest_both_ways(xx, en)
    truth = np.arange(len(xx))
    return ((to_en != truth).astype(float) + (to_xx != truth)) / 2


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="model files or shipped names")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PARAPHRASTIC_DATA", "../shared/data")))
    p.add_argument("--near", type=float, default=0.3, help="trigram overlap from which a test pair is near (0.3)")
    args = p.parse_args()
    split = {lang: near_pairs(args.data_dir, lang, args.near) for lang in TATOEBA}
    print("near test pairs:", " ".join(f"{lang} {int(near.sum())}" for lang, near in split.items()))
    for name in args.models:
        model, cells = load_model(name), []
        for lang, near in split.items():
            wrong = errors(model, args.data_dir, lang)
            cells.append(f"{lang} {100 * wrong[near].mean():.1f} / {100 * wrong[~near].mean():.1f}")
        print(f"{name} (near / far):", ", ".join(cells), flush=True)
