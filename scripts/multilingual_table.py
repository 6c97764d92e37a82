"""The multilingual model card's table: STS 2017 (Pearson x 100), Tatoeba, PUD and FLORES retrieval error x 100
(mean of both directions) for the seven languages, and English STS 2012-2016, for each system named: a model
file or shipped name, or `use` (the multilingual USE v3 teacher, from the `multilingual` extra).

    python scripts/multilingual_table.py multilingual use [--data-dir ../shared/data] [--json out.json]
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np

from paraphrastic import evaluate
from paraphrastic.models import load_model
from paraphrastic.teacher import USE_TEACHER, load_teacher

TASKS = ["sts", "sts17", "tatoeba", "pud", "flores"]
STS17 = ["ar-ar", "ar-en", "es-es", "es-en", "tr-en"]


class Teacher:
    """A teacher with the one method evaluate.py asks of a model."""

    def __init__(self, name: str):
        self.teacher = load_teacher(name)

    def embed_raw_text(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        return self.teacher.encode(texts).astype(np.float32)


def row(name: str, r: dict) -> str:
    sts17 = [r["sts17"]["sets"][k]["pearson"] for k in STS17]
    errors = [
        " / ".join(f"{r[task]['langs'][lang]['mean']:.1f}" for lang in evaluate.DEFAULT_LANGS)
        + f" ({r[task]['avg']['mean']:.1f})"
        for task in ("tatoeba", "pud", "flores")
    ]
    six = np.mean([r["tatoeba"]["langs"][lang]["mean"] for lang in evaluate.DEFAULT_LANGS[:6]])
    cells = [name, *(f"{x:.1f}" for x in sts17), f"{np.mean([sts17[1], sts17[3], sts17[4]]):.1f}"]
    cells += [f"{errors[0]}, six: {six:.1f}", *errors[1:], f"{r['sts']['avg']['pearson']:.1f}"]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("systems", nargs="+", help="model files, shipped names, or `use`")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PARAPHRASTIC_DATA", "../shared/data")))
    p.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args()
    head = ["system", *STS17, "cross-lingual mean", "Tatoeba ara/deu/spa/fra/rus/tur/cmn (mean of 7)"]
    head += ["PUD (mean of 7)", "FLORES (mean of 7)", "English STS12-16"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    results = {}
    for name in args.systems:
        model = Teacher(USE_TEACHER) if name == "use" else load_model(name)
        results[name] = evaluate.evaluate(model, args.data_dir, TASKS, evaluate.DEFAULT_LANGS)
        print(row(name, results[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(evaluate.json_safe(results), indent=1) + "\n")
