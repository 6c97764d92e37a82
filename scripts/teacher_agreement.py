"""How closely English models keep their teachers' similarities on held-apart text: the Pearson x 100 between a
model's cosines and the teachers' (side by side, teacher.encode_teachers) over 20,000 random pairs of sentences
that no model was trained toward, once for sentences holding a character outside ASCII ('’', 'é', '–') and once
for ASCII-only ones. A dev check for how a model reads text, beside the STS dev sets (which are mostly ASCII).

    python scripts/teacher_agreement.py MODEL [MODEL ...] --text runs/default/distill.txt --skip 1300000
"""

import argparse
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr

from paraphrastic.fileio import read_lines
from paraphrastic.models import load_model
from paraphrastic.static import cosine
from paraphrastic.teacher import encode_teachers, load_teacher


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="+", help="model files or names (models.load_model)")
    p.add_argument("--text", type=Path, required=True, help="one sentence per line")
    p.add_argument("--skip", type=int, default=1_300_000, help="lines to skip: those any model was trained toward")
    p.add_argument("--sentences", type=int, default=3000, help="sentences of each kind")
    p.add_argument("--teachers", default="all-MiniLM-L6-v2,use-multilingual-v3")
    args = p.parse_args()
    lines = read_lines(args.text)[args.skip :]
    teachers = {name: load_teacher(name) for name in args.teachers.split(",")}
    models = {name: load_model(name) for name in args.models}
    for kind, texts in [
        ("non-ASCII", [s for s in lines if not s.isascii()][: args.sentences]),
        ("ASCII", [s for s in lines if s.isascii()][: args.sentences]),
    ]:
        target = encode_teachers(teachers, texts)
        i, j = np.random.default_rng(0).integers(0, len(texts), (2, 20_000))
        teacher_cos = cosine(target[i], target[j])
        for name, model in models.items():
            v = model.embed_raw_text(texts)
            print(
                f"{kind:9s} {len(texts):5d} sentences  {name}: {100 * pearsonr(cosine(v[i], v[j]), teacher_cos)[0]:.2f}"
            )


if __name__ == "__main__":
    main()
