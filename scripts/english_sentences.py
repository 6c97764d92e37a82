"""Write the distinct English sentences of the training data, in a fixed seeded order, one per line.

Sources: both sides of the English paraphrase pairs (captions, ASSET) and the English side of every
bitext file except the Tatoeba-Challenge ones (Tatoeba is a test domain). No STS-family text.

    python scripts/english_sentences.py DATA_DIR [--max N] > sentences.txt
"""

import argparse
import gzip
import random
import sys
from pathlib import Path


def english_sentences(data: Path, skip_tatoeba: bool = True) -> list[str]:
    """Distinct non-empty English sentences, in a seeded random order (Tatoeba-Challenge bitext skipped
    unless `skip_tatoeba` is False, as for the speed benchmarks, where it is not a test domain)."""
    files = sorted((data / "train" / "en_paraphrase").glob("*.pairs.tsv.gz"))
    bitext = sorted((data / "train" / "bitext").glob("**/*.tsv.gz"))
    files += [p for p in bitext if not (skip_tatoeba and "tatoeba" in p.parent.name)]
    seen: dict[str, None] = {}
    for path in files:
        both_sides = path.parent.name == "en_paraphrase"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                cols = line.rstrip("\n").split("\t")
                seen.update((s, None) for s in (cols if both_sides else cols[:1]) if s)
    sentences = list(seen)
    random.Random(0).shuffle(sentences)
    return sentences


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", type=Path)
    p.add_argument("--max", type=int, help="keep only the first N sentences of the fixed order")
    args = p.parse_args()
    sentences = english_sentences(args.data_dir)[: args.max]
    sys.stdout.write("".join(s + "\n" for s in sentences))
