"""Teachers, alone and side by side, scored on the English dev sets that choose the default model: STS 2017
en-en, STS Benchmark dev and STS 2012 train (Pearson x 100 of the cosines of the teachers' own vectors). A
combination is what teacher.encode_teachers builds: each teacher's vectors at unit length, set side by side.
Then the forum part of the STS Benchmark dev set and the error of retrieval within the held-apart WMT groups
(scripts/dev_parts.py). Vectors are cached like
every teacher's (teacher.encode_cached). No test set is read.

    python scripts/teacher_dev.py all-MiniLM-L6-v2 use-multilingual-v3 all-mpnet-base-v2 [--data-dir ../shared/data]
"""

import argparse
import itertools
import os
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr

from paraphrastic.evaluate import Pairs, read_sts_pairs, retrieval_errors
from paraphrastic.preprocess import wmt
from paraphrastic.static import unit_rows
from paraphrastic.teacher import encode_teachers, english_training_sentences, load_teacher

# The STS Benchmark dev set's three parts, in file order (lines 1-625, 626-1000, 1001-1500; scripts/dev_parts.py).
PARTS = {"captions": slice(0, 625), "forum": slice(625, 1000), "news": slice(1000, 1500)}


def dev_sets(data: Path) -> dict[str, Pairs]:
    """Each dev set's pairs; STS 2012 train is its three files together."""
    files = {
        "sts17-en": [data / "sts" / "2017" / "en-en.tsv"],
        "stsb-dev": [data / "sts" / "en" / "stsb" / "dev.tsv"],
        "sts12-train": sorted((data / "sts" / "en" / "2012-train").glob("*.tsv")),
    }
    out = {}
    for name, paths in files.items():
        parts = [read_sts_pairs(path) for path in paths]
        out[name] = Pairs(
            [t for q in parts for t in q.s1], [t for q in parts for t in q.s2], np.concatenate([q.gold for q in parts])
        )
    return out


def wmt_dev_pairs(data: Path) -> list[tuple[str, str]]:
    """The held-apart WMT groups' retrieval pairs (`preprocess.wmt.dev_pairs`), none of whose sentences the
    default's training text holds."""
    return wmt.dev_pairs(data, exclude=set(english_training_sentences(data)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("teachers", nargs="+", help="teacher names (teacher.load_teacher)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PARAPHRASTIC_DATA", "../shared/data")))
    args = p.parse_args()
    sets = dev_sets(args.data_dir)
    pairs = wmt_dev_pairs(args.data_dir)
    texts = sorted({t for q in sets.values() for t in q.s1 + q.s2} | {t for pair in pairs for t in pair})
    row = {t: i for i, t in enumerate(texts)}
    vectors = {name: encode_teachers({name: load_teacher(name)}, texts) for name in args.teachers}
    width = len(" + ".join(args.teachers))
    print(f"{'teachers':{width}s} " + " ".join(f"{name:>11s}" for name in sets) + "   mean  forum  wmt-err")
    for k in range(1, len(args.teachers) + 1):
        for combo in itertools.combinations(args.teachers, k):
            both = unit_rows(np.concatenate([vectors[name] for name in combo], 1))
            cos = {
                name: (both[[row[t] for t in q.s1]] * both[[row[t] for t in q.s2]]).sum(1) for name, q in sets.items()
            }
            figures = [100 * pearsonr(cos[name], q.gold)[0] for name, q in sets.items()]
            forum = 100 * pearsonr(cos["stsb-dev"][PARTS["forum"]], sets["stsb-dev"].gold[PARTS["forum"]])[0]
            queries, keys = both[[row[a] for a, _ in pairs]], both[[row[b] for _, b in pairs]]
            err = float(np.mean(retrieval_errors(queries, keys)))
            print(
                f"{' + '.join(combo):{width}s} "
                + " ".join(f"{f:11.1f}" for f in figures)
                + f"  {np.mean(figures):.2f}  {forum:5.1f}  {err:7.2f}"
            )


if __name__ == "__main__":
    main()
