"""What a model cannot read in a text: the share of lines that hold at least one unknown piece, and the text most
often read as unknown. A vocabulary check; it says nothing about quality.

    python scripts/unknown_pieces.py default multilingual --text ../shared/data/train/foreign_text/zh.txt.gz --lines 30000
"""

import argparse
import itertools
from collections import Counter
from pathlib import Path

from paraphrastic.encoders import cased
from paraphrastic.fileio import open_binary
from paraphrastic.models import load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="+", help="model files or names (models.load_model)")
    p.add_argument("--text", type=Path, required=True, help="one sentence per line, plain or .gz")
    p.add_argument("--lines", type=int, default=30_000, help="read the first LINES lines")
    args = p.parse_args()
    with open_binary(args.text) as f:
        lines = [line.decode("utf-8", "replace").rstrip("\n") for line in itertools.islice(f, args.lines)]
    for name in args.models:
        tokenizer = load_model(name).sp_tokenizer
        sp, unknown, lines_with = tokenizer.sp, Counter(), 0
        texts = cased(lines, tokenizer.lowercase)  # pieces as text hold an unknown piece's surface, not <unk>
        for ids, surfaces in zip(sp.encode(texts), sp.encode(texts, out_type=str), strict=True):
            pieces = [s for i, s in zip(ids, surfaces, strict=True) if i == sp.unk_id()]
            lines_with += bool(pieces)
            unknown.update(pieces)
        top = ", ".join(f"{text!r} {n}" for text, n in unknown.most_common(10))
        print(
            f"{name}: {100 * lines_with / len(lines):.1f}% of {len(lines)} lines hold an unknown piece; most often: {top}"
        )


if __name__ == "__main__":
    main()
