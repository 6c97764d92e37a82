"""How often mining takes a sentence of the anchor's own paraphrase group as its hardest negative, when only copies
and known paraphrases are kept out (what training did before the pairs named their groups): the WMT systems'
training pairs (`wmt.training_pairs`), embedded by MODEL, mined in random mega-batches of PAIRS pairs (the
recipe's M = 10 batches of 128).

    python scripts/group_negatives.py [MODEL] [--data-dir ../shared/data] [--megabatches 30] [--pairs 1280]
"""

import argparse
import os
from pathlib import Path

import numpy as np
import torch

from paraphrastic.models import load_model
from paraphrastic.negatives import mine_hardest, sentence_groups
from paraphrastic.preprocess import wmt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default="default", help="(default %(default)s)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PARAPHRASTIC_DATA", "../shared/data")))
    p.add_argument("--megabatches", type=int, default=30, help="mega-batches drawn (default %(default)s)")
    p.add_argument("--pairs", type=int, default=1280, help="pairs in a mega-batch (default %(default)s)")
    args = p.parse_args()
    model = load_model(args.model)
    src, tgt, groups = (list(column) for column in zip(*wmt.training_pairs(args.data_dir), strict=True))
    ids = [model.token_ids(side) for side in (src, tgt)]
    bags = [np.split(flat, np.cumsum(lengths)[:-1]) for flat, lengths in ids]
    vectors = [model.encode(side) for side in (src, tgt)]
    labels, rng, same, anchors = np.array(groups, dtype=np.int64), np.random.default_rng(0), 0, 0
    for _ in range(args.megabatches):
        picked = rng.choice(len(src), min(args.pairs, len(src)), replace=False)
        sentences = [bags[side][i] for side in (0, 1) for i in picked]
        lengths = torch.tensor([len(s) for s in sentences])
        offsets = torch.cumsum(lengths, 0) - lengths
        found = sentence_groups(torch.from_numpy(np.concatenate(sentences)), offsets)
        stacked = torch.from_numpy(np.concatenate([vectors[0][picked], vectors[1][picked]]))
        negatives = mine_hardest(stacked, found, bitext=False, dtype=torch.float32).numpy()
        own = np.tile(labels[picked], 2)
        mined = negatives >= 0
        same += int((own[negatives[mined]] == own[mined]).sum())
        anchors += int(mined.sum())
    print(f"{args.model}: {same:,} of {anchors:,} anchors ({100 * same / max(anchors, 1):.2f}%) mined a sentence of their own "
          f"group ({args.megabatches} mega-batches of {args.pairs:,} WMT pairs)")  # fmt: skip


if __name__ == "__main__":
    main()
