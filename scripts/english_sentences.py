"""Write the distinct English sentences of the training data, in a fixed seeded order, one per line
(captions, ASSET, the English side of every bitext file but Tatoeba-Challenge; no STS-family text).

    python scripts/english_sentences.py DATA_DIR [--max N] > sentences.txt
"""

import argparse
import sys
from pathlib import Path

from paraphrastic.teacher import english_training_sentences

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", type=Path)
    p.add_argument("--max", type=int, help="keep only the first N sentences of the fixed order")
    args = p.parse_args()
    sentences = english_training_sentences(args.data_dir)[: args.max]
    sys.stdout.write("".join(s + "\n" for s in sentences))
