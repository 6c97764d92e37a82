"""Write the distinct English sentences of the training data, in a fixed seeded order, one per line
(captions, ASSET, the English side of every bitext file but Tatoeba-Challenge; no STS-family text). With --wmt,
the WMT systems' English sentences instead (their groups and bitext, the held-apart test sets left out), less those
of the first list.

    python scripts/english_sentences.py DATA_DIR [--max N] [--wmt] > sentences.txt
"""

import argparse
import sys
from pathlib import Path

from paraphrastic.preprocess import wmt
from paraphrastic.teacher import english_training_sentences

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", type=Path)
    p.add_argument("--max", type=int, help="keep only the first N sentences of the fixed order")
    p.add_argument("--wmt", action="store_true", help="the WMT systems' English sentences not in the first list")
    args = p.parse_args()
    sentences = english_training_sentences(args.data_dir)
    if args.wmt:
        sentences = wmt.english_sentences(args.data_dir, exclude=set(sentences))
    sys.stdout.write("".join(s + "\n" for s in sentences[: args.max]))
