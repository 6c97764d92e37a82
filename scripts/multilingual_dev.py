"""The dev figures that choose the multilingual model: English STS dev sets (STS 2017 en-en, STS Benchmark dev,
STS 2012 train; Pearson x 100) and retrieval error x 100 on the held-apart bitext pairs that
scripts/multilingual_text.py cut per language: each foreign sentence looks for its English side among those
300 and 20,000 English Wikipedia sentences the model never trained on (lines 200,000-220,000 of
train/en_text/enwiki_2018_articles.txt.gz), which makes the task hard enough to tell models apart; and, per
language, the agreement with the teacher on those pairs: the Pearson x 100 between the model's cosines of two
foreign sentences (and of a foreign sentence and another pair's English side) and the teacher's cosine of the two
English sides, over all pairs of the 300 (a finer signal than 300 retrievals); and the same agreement on short
text, 300 spans of 3-10 words cut from those foreign sentences, against the teacher's cosines of the spans
themselves; and "outside": the agreement of the foreign-foreign cosines with all-MiniLM-L6-v2's cosines of the
English sides, a stronger English model that no multilingual training uses; and where the folder holds
heldout-challenge.<lang>.tsv (CHALLENGE=1), "challenge": the retrieval error on those held-apart Tatoeba-Challenge
pairs, short everyday sentences as in Tatoeba, among the same 20,000 distractors. No test set is read.

    python scripts/multilingual_dev.py MODEL [MODEL ...] --heldout runs/multilingual [--data-dir ../shared/data]
"""

import argparse
import gzip
import itertools
import os
from pathlib import Path

import numpy as np
from multilingual_relate import teacher_views  # sibling scripts
from multilingual_text import spans

from paraphrastic import knn
from paraphrastic.evaluate import score_sts_file
from paraphrastic.fileio import read_lines
from paraphrastic.models import load_model
from paraphrastic.static import unit_rows
from paraphrastic.teacher import DEFAULT_TEACHER, E5_TEACHER, USE_TEACHER, encode_cached, load_teacher


def distractors(data: Path, start: int = 200_000, count: int = 20_000) -> list[str]:
    with gzip.open(data / "train" / "en_text" / "enwiki_2018_articles.txt.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in itertools.islice(f, start, start + count)]


def heldout_pairs(path: Path) -> tuple[list[str], list[str]]:
    """The English and the foreign sides of a held-apart pairs file (english<TAB>foreign lines)."""
    en, xx = zip(*(line.split("\t") for line in read_lines(path)), strict=True)
    return list(en), list(xx)


def retrieval_error(en_vectors: np.ndarray, xx_vectors: np.ndarray, extra: np.ndarray) -> float:
    """Error x 100 of each foreign sentence searching its English side among all English sides and `extra`."""
    found, _ = knn.nearest_both_ways(xx_vectors, np.concatenate([en_vectors, extra]))
    return 100 * float(np.mean(found != np.arange(len(xx_vectors))))


def agreement(cosines: np.ndarray, reference: np.ndarray) -> float:
    """Pearson x 100 between two cosine matrices over all pairs i != j."""
    off = ~np.eye(len(reference), dtype=bool)
    return 100 * float(np.corrcoef(cosines[off], reference[off])[0, 1])


def teacher_figures(heldout: Path, teacher, outsider) -> dict[str, float]:
    """The "outside" agreement of the teachers themselves on the held-apart foreign sentences: USE's cosines,
    multilingual-e5-small's (its vectors centred on the 300, which spreads its crowded cosines) and the mean of the
    two (what scripts/multilingual_relate.py teaches)."""
    e5, out = load_teacher(E5_TEACHER), {}
    for path in sorted(heldout.glob("heldout.*.tsv")):
        en, xx = heldout_pairs(path)
        lang = path.stem.split(".")[1]
        judged = unit_rows(encode_cached(outsider, DEFAULT_TEACHER, en).astype(np.float32))
        use, centred = teacher_views(teacher, e5, xx)
        reference, views = judged @ judged.T, {"use": use @ use.T, "e5": centred @ centred.T}
        views["mean"] = (views["use"] + views["e5"]) / 2
        out |= {f"outside-{name}-{lang}": agreement(view, reference) for name, view in views.items()}
    return out


def dev_figures(model, heldout: Path, data: Path, teacher, outsider) -> dict[str, float]:
    sts = {
        "sts17-en": data / "sts" / "2017" / "en-en.tsv",
        "stsb-dev": data / "sts" / "en" / "stsb" / "dev.tsv",
        "sts12-train": heldout / "sts12-train.tsv",
    }
    out = {name: score_sts_file(model, path)["pearson"] for name, path in sts.items()}
    out["sts-mean"] = float(np.mean(list(out.values())))
    extra = model.encode(distractors(data))
    errors, agreements, short, outside = {}, {}, {}, {}
    for path in sorted(heldout.glob("heldout.*.tsv")):
        en, xx = heldout_pairs(path)
        en_vectors, xx_vectors = model.encode(en), model.encode(xx)
        lang = path.stem.split(".")[1]
        errors[lang] = retrieval_error(en_vectors, xx_vectors, extra)
        taught = encode_cached(teacher, USE_TEACHER, en).astype(np.float32)
        reference = model.similarity(taught, taught)
        views = [model.similarity(xx_vectors, xx_vectors), model.similarity(xx_vectors, en_vectors)]
        agreements[f"agree-{lang}"] = float(np.mean([agreement(view, reference) for view in views]))
        judged = encode_cached(outsider, DEFAULT_TEACHER, en).astype(np.float32)
        outside[f"outside-{lang}"] = agreement(views[0], model.similarity(judged, judged))
        cut = spans(xx, len(xx), lang)
        taught = encode_cached(teacher, USE_TEACHER, cut).astype(np.float32)
        short[f"short-{lang}"] = agreement(model.similarity(cut, cut), model.similarity(taught, taught))
    challenge = {}  # with CHALLENGE=1: the same retrieval on held-apart Tatoeba-Challenge pairs (Tatoeba's register)
    for path in sorted(heldout.glob("heldout-challenge.*.tsv")):
        en, xx = heldout_pairs(path)
        challenge[f"challenge-{path.stem.split('.')[1]}"] = retrieval_error(model.encode(en), model.encode(xx), extra)
    named = ((errors, "error-mean"), (agreements, "agree-mean"), (short, "short-mean"), (outside, "outside-mean"),
             (challenge, "challenge-mean"))  # fmt: skip
    for figures, mean in named:
        if figures:
            out |= figures | {mean: float(np.mean(list(figures.values())))}
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="model files or shipped names")
    p.add_argument("--teachers", action="store_true", help="also the teachers' own outside agreement")
    p.add_argument("--heldout", type=Path, required=True, help="folder of heldout.<lang>.tsv and sts12-train.tsv")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PARAPHRASTIC_DATA", "../shared/data")))
    args = p.parse_args()
    teacher, outsider = load_teacher(USE_TEACHER), load_teacher(DEFAULT_TEACHER)
    if args.teachers:
        print("teachers", " ".join(f"{k} {v:.1f}" for k, v in teacher_figures(args.heldout, teacher, outsider).items()))
    for name in args.models:
        figures = dev_figures(load_model(name), args.heldout, args.data_dir, teacher, outsider)
        print(name, " ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
