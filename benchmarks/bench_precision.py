"""What encode's `precision` and `truncate_dim` keep: STS correlations of the shipped models' vectors as float32
(whole, or their first 128 or 64 values), int8 and binary.

    python benchmarks/bench_precision.py [--data-dir ../shared/data] [--models default FILE ...] [--no-retrieval]

The dev sets only (STS Benchmark dev, STS 2017 en-en, STS 2012 train): every distinct sentence of them is
embedded in one `encode(..., precision=P)` call, so the int8 steps come from those rows together, as a user's
corpus would give them. A pair scores the cosine of its two rows (int8 values as numbers) or, for binary rows,
the share of their sign bits that agree (1 - Hamming / bits). uint8 and ubinary are the same bytes plus 128,
so they rank alike. Prints Spearman x 100 per set and the bytes of a row. Then, for the multilingual model, what
bitext mining keeps: the error rate of nearest-neighbour retrieval (x 100, both ways, averaged over its seven
languages) on Tatoeba, PUD and FLORES, test sets reported, not chosen by, each language's two sides encoded in one
call.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import DATA, machine_header

import paraphrastic
from paraphrastic import evaluate, static

SETS = {"STSb dev": "sts/en/stsb/dev.tsv", "STS17 en-en": "sts/2017/en-en.tsv", "STS12 train": "sts/en/2012-train"}
WAYS = (("float32", None), ("float32", 128), ("float32", 64), ("int8", None), ("binary", None))  # (precision, dims)


def read_sets(root: Path) -> dict[str, evaluate.Pairs]:
    """The dev sets' pairs, the 2012 train files as one set."""
    out = {}
    for name, where in SETS.items():
        files = sorted((root / where).glob("*.tsv")) if (root / where).is_dir() else [root / where]
        parts = [evaluate.read_sts_pairs(f) for f in files]
        out[name] = evaluate.Pairs(
            [s for p in parts for s in p.s1], [s for p in parts for s in p.s2], np.concatenate([p.gold for p in parts])
        )
    return out


def way_name(precision: str, dims: int | None) -> str:
    return precision if dims is None else f"{precision}, first {dims} values"


def agreement(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """Row i of `a` against row i of `b`: the share of equal sign bits for packed rows, else the cosine."""
    if precision.endswith("binary"):
        return 1 - np.unpackbits(a.view(np.uint8) ^ b.view(np.uint8), axis=1).mean(axis=1)
    return static.cosine(a.astype(np.float32), b.astype(np.float32))


def retrieval_error(a: np.ndarray, b: np.ndarray, precision: str) -> float:
    """Error rate x 100 of nearest-neighbour retrieval both ways, row i pairing with row i: by cosine, or for
    binary rows by the bits that agree (as +-1 values, whose dot product is agreements minus disagreements)."""
    if precision.endswith("binary"):
        x, y = (np.unpackbits(v.view(np.uint8), axis=1).astype(np.float32) * 2 - 1 for v in (a, b))
    else:
        x, y = (static.unit_rows(v.astype(np.float32)) for v in (a, b))
    similar, gold = x @ y.T, np.arange(len(a))
    return 50 * float(np.mean(similar.argmax(axis=1) != gold) + np.mean(similar.argmax(axis=0) != gold))


def retrieval_table(model, root: Path) -> None:
    """The multilingual model's mean retrieval error per task and precision."""
    print("\nmultilingual model: retrieval error x 100, both ways, mean over its languages\n")
    print("| precision | bytes a row | Tatoeba | PUD | FLORES |")
    print("|---|---|---|---|---|")
    for precision, dims in WAYS:
        cells, size = [], 0
        for task in ("tatoeba", "pud", "flores"):
            errors = []
            for lang in evaluate.DEFAULT_LANGS:
                files = evaluate.retrieval_files(root, task, lang)
                if files is not None:
                    xx, eng = evaluate.parallel_lines(*files)
                    rows = model.encode(xx + eng, precision=precision, truncate_dim=dims)
                    errors.append(retrieval_error(rows[: len(xx)], rows[len(xx) :], precision))
                    size = rows[0].nbytes
            cells.append(f"{np.mean(errors):.2f} ({len(errors)})" if errors else "absent")
        print(f"| {way_name(precision, dims)} | {size} | {' | '.join(cells)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=DATA)
    p.add_argument("--models", nargs="+", default=["default", "multilingual"], help="names or files (%(default)s)")
    p.add_argument("--no-retrieval", action="store_true", help="leave out the multilingual retrieval table")
    args = p.parse_args()
    sets = read_sets(args.data_dir)
    texts = sorted({t for pairs in sets.values() for t in (*pairs.s1, *pairs.s2)})
    row = {t: i for i, t in enumerate(texts)}
    print(machine_header())
    print(f"{len(texts):,} distinct sentences of {', '.join(f'{k} ({len(v.gold):,} pairs)' for k, v in sets.items())}")
    for name in args.models:
        model = paraphrastic.load_encoder(name)
        positive = float((model.encode(texts) > 0).mean())  # sign bits say most where half of the values are
        print(f"\n{name} model: Spearman x 100 (of its values on these sentences, {positive:.3f} are above 0)\n")
        print(f"| precision | bytes a row | {' | '.join(sets)} |")
        print("|---|---|" + "---|" * len(sets))
        for precision, dims in WAYS:
            rows = model.encode(texts, precision=precision, truncate_dim=dims)
            scores = []
            for pairs in sets.values():
                a = rows[[row[t] for t in pairs.s1]]
                b = rows[[row[t] for t in pairs.s2]]
                scores.append(evaluate.correlations(agreement(a, b, precision), pairs.gold)["spearman"])
            cells = " | ".join(f"{s:.2f}" for s in scores)
            print(f"| {way_name(precision, dims)} | {rows.shape[1] * rows.itemsize} | {cells} |")
    if not args.no_retrieval:
        retrieval_table(paraphrastic.load_encoder("multilingual"), args.data_dir)


if __name__ == "__main__":
    main()
