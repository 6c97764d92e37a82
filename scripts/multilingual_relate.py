"""The multilingual model's second relational signal (train.py --relate): short spans of a language's monolingual
text, each with two teachers' vectors side by side, multilingual USE v3 and multilingual-e5-small, each scaled to
unit length (e5's after subtracting its mean over the spans, which spreads its crowded cosines), so the cosine of
two rows is the mean of the two teachers' cosines. On the held-apart Arabic pairs that mean agrees better with
all-MiniLM-L6-v2's cosines of the English sides than either teacher alone does. Writes OUT/relate.txt and
OUT/relate.npy (vectors cached by content; e5, about 80 short spans a second on 2 cores, in small shards).

    python scripts/multilingual_relate.py runs/multilingual runs/multilingual --langs ar --spans 30000
"""

import argparse
from pathlib import Path

import numpy as np
from multilingual_text import spans  # a sibling script

from paraphrastic.fileio import atomic_output, read_lines
from paraphrastic.static import unit_rows
from paraphrastic.teacher import E5_TEACHER, USE_TEACHER, encode_cached, load_teacher, save_npy


def teacher_views(use, e5, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """USE's vectors of `texts` and e5's, centred on `texts`, each row of unit length (e5 in shards of 2,000: slow)."""
    centred = encode_cached(e5, E5_TEACHER, texts, shard=2000).astype(np.float32)
    centred -= centred.mean(0)
    return unit_rows(encode_cached(use, USE_TEACHER, texts).astype(np.float32)), unit_rows(centred)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="the run's folder (mono.<lang>.txt from multilingual_text.py)")
    p.add_argument("out", type=Path, help="where relate.txt and relate.npy go")
    p.add_argument("--langs", nargs="+", default=["ar"], help="languages whose spans are related (default: ar)")
    p.add_argument("--spans", type=int, default=30_000, help="spans of 3-10 words per language (30,000)")
    args = p.parse_args()
    use, e5 = load_teacher(USE_TEACHER), load_teacher(E5_TEACHER)
    texts, rows = [], []
    for lang in args.langs:
        cut = spans(read_lines(args.run / f"mono.{lang}.txt"), args.spans, f"e5-{lang}")
        rows.append(np.concatenate(teacher_views(use, e5, cut), 1))
        texts += cut
    with atomic_output(args.out / "relate.txt", "w") as f:
        f.write("".join(t + "\n" for t in texts))
    save_npy(args.out / "relate.npy", np.concatenate(rows).astype(np.float16))
    print(f"{args.out}: {len(texts)} spans related by {USE_TEACHER} and {E5_TEACHER}")
