"""The multilingual model's distillation targets and starting table, from a run's text (scripts/multilingual_text.py),
its sentencepiece model and the teacher (vectors cached by content, so a rerun or a probe computes nothing twice).

Each sentence's target is the teacher's vector of itself, except that both sides of a bitext pair get the
vector of the English side; PCA to --dim is fitted on 200,000 targets, and the table is the projected piece
vectors times a / (a + p(piece)), a = 1e-3. Writes OUT/init.pt, OUT/targets.npy and OUT/targets.txt (line i is
the sentence of row i) in the order of the run's distill.txt (monolingual, bitext foreign sides, bitext English
sides, English), then, with --repeat LANG=N, N - 1 more copies of LANG's rows (its monolingual sentences and bitext
foreign sides): more of each update's distillation batch for a language whose figures lag. With --second-teacher LANG,
LANG's monolingual sentences are taught a mix of two teachers (mix_teachers): USE's vector and multilingual-e5-small's
mapped into USE's space, e5's share --second-weight (e5 is slow: about 40 news sentences a second on 2 cores).

    python scripts/multilingual_targets.py runs/multilingual runs/multilingual --repeat ar=2 --second-teacher ar
    python scripts/multilingual_targets.py runs/multilingual runs/probe --max-sentences 50000

With --max-sentences (a dev probe) only the first N monolingual sentences per language and N English ones are
kept (0: none). The piece frequencies of the table's weights are always those of the run's distill.txt.
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from paraphrastic.fileio import atomic_output, read_lines
from paraphrastic.models import SPModel, Tokenizer
from paraphrastic.static import unit_rows
from paraphrastic.teacher import (
    E5_TEACHER,
    USE_TEACHER,
    encode_cached,
    fit_pca,
    initial_table,
    load_teacher,
    piece_probabilities,
    piece_texts,
    save_npy,
)


def mix_teachers(use: np.ndarray, e5: np.ndarray, weight: float) -> np.ndarray:
    """Unit rows: (1 - weight) x USE's unit vectors + weight x e5's mapped into USE's space, by the least-squares affine
    map fitted on these same sentences: one target that carries both teachers' views (a probe; the card has it)."""
    use, e5 = use.astype(np.float32), np.c_[e5.astype(np.float32), np.ones(len(e5), np.float32)]
    mapping, *_ = np.linalg.lstsq(e5, use, rcond=None)
    return unit_rows((1 - weight) * unit_rows(use) + weight * unit_rows(e5 @ mapping))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="the run's folder (text from multilingual_text.py, sp.model)")
    p.add_argument("out", type=Path, help="where init.pt, targets.npy and targets.txt go")
    p.add_argument("--max-sentences", type=int, help="a probe: monolingual sentences per language, and English ones")
    p.add_argument("--dim", type=int, default=300)
    p.add_argument("--repeat", nargs="*", default=[], metavar="LANG=N", help="teach LANG's sentences N times over")
    p.add_argument("--second-teacher", nargs="*", default=[], metavar="LANG", help="LANG's sentences: USE and e5")
    p.add_argument("--second-weight", type=float, default=0.5, help="e5's share of those targets (default 0.5)")
    args = p.parse_args()
    repeat = {lang: int(n) for lang, n in (item.split("=") for item in args.repeat)}
    args.out.mkdir(parents=True, exist_ok=True)
    teacher = load_teacher(USE_TEACHER)
    pairs = [line.split("\t") for line in read_lines(args.run / "bitext.tsv")]
    english_sides = encode_cached(teacher, USE_TEACHER, [pair[0] for pair in pairs])
    texts, langs, vectors = [], [], []

    def add(lines: list[str], lang: str | list[str], targets: np.ndarray | None = None) -> None:
        texts.extend(lines)
        langs.extend([lang] * len(lines) if isinstance(lang, str) else lang)
        vectors.append(encode_cached(teacher, USE_TEACHER, lines) if targets is None else targets)

    for path in sorted(args.run.glob("mono.*.txt")):  # distill.txt's order: `cat mono.*.txt`
        lang = path.name.split(".")[1]
        lines = read_lines(path)[: args.max_sentences]
        if lang in args.second_teacher:
            e5 = encode_cached(load_teacher(E5_TEACHER), E5_TEACHER, lines)
            mixed = mix_teachers(encode_cached(teacher, USE_TEACHER, lines), e5, args.second_weight)
            add(lines, lang, mixed.astype(np.float16))
        else:
            add(lines, lang)
    add([pair[1] for pair in pairs], [pair[2] for pair in pairs], english_sides)
    add([pair[0] for pair in pairs], "en", english_sides)
    add(read_lines(args.run / "en.txt")[: args.max_sentences], "en")
    raw = np.concatenate(vectors)
    tokenizer = Tokenizer((args.run / "sp.model").read_bytes(), lowercase=True)
    pieces = encode_cached(teacher, USE_TEACHER, piece_texts(tokenizer)).astype(np.float32)
    sample = np.random.default_rng(0).choice(len(raw), min(200_000, len(raw)), replace=False)
    pca = fit_pca(raw[sample].astype(np.float32), args.dim)
    table = initial_table(pieces, piece_probabilities(tokenizer, args.run / "distill.txt"), pca, 1e-3)
    config = {"source": "teacher.py", "teacher": USE_TEACHER, "sif_a": 1e-3}
    SPModel(tokenizer, torch.from_numpy(table), config).save(args.out / "init.pt")
    targets = [(raw[i : i + 100_000].astype(np.float32) - pca[0]) @ pca[1] for i in range(0, len(raw), 100_000)]
    labels = np.array(langs)
    copies = [np.flatnonzero(labels == lang) for lang, n in repeat.items() for _ in range(n - 1)]
    order = np.concatenate([np.arange(len(texts)), *copies])
    with atomic_output(args.out / "targets.txt", "w") as f:
        f.write("".join(texts[i] + "\n" for i in order))
    save_npy(args.out / "targets.npy", np.concatenate(targets).astype(np.float16)[order])
    print(f"{args.out}: targets of {len(order)} sentences ({len(texts)} distinct), table {len(tokenizer)} x {args.dim}")
