"""Score sentence pairs (`sentence1<TAB>sentence2` per line) by the cosine of their embeddings.

Each output line is `sentence1<TAB>sentence2<TAB>score`, in input order. A line without exactly one
tab is an error naming its line number, unless --skip-bad-lines skips (and counts) it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch
from tqdm import tqdm

from paraphrastic.fileio import (
    InputError,
    atomic_output,
    count_lines,
    iter_line_chunks,
    open_input,
    remove_stale_temps,
    run_cli,
    split_pair,
)
from paraphrastic.models import load_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentence-pair-file", required=True, help="UTF-8 text, sentence1<TAB>sentence2 per line")
    p.add_argument("--load-file", help="model file (default: the shipped English model)")
    p.add_argument("--sp-model", help="sentencepiece model, only for original-toolkit model files")
    p.add_argument("--output-file", help="output file (default: stdout)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip lines without exactly one tab")
    p.add_argument("--batch-size", type=int, default=8192, help="pairs per tokenize+pool step")
    p.add_argument("--chunk-lines", type=int, default=131072, help="lines read from disk at a time")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    p.add_argument("--threads", type=int, help="CPU threads for tokenizing and pooling (default: all)")
    p.add_argument("--strict", action="store_true", help="fail on invalid UTF-8 instead of replacing it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def read_pairs(lines: list[str], path: str, first_line: int, skip_bad: bool) -> tuple[list[tuple[str, str]], int]:
    """Split a chunk of lines into pairs; returns (pairs, number of skipped bad lines)."""
    pairs, skipped = [], 0
    for i, line in enumerate(lines):
        try:
            pairs.append(split_pair(line, path, first_line + i))
        except InputError:
            if not skip_bad:
                raise
            skipped += 1
    return pairs, skipped


def score_file(model, args: argparse.Namespace, out) -> tuple[int, int, dict]:
    """Score every pair of the input into `out`; returns (pairs written, lines skipped, stats)."""
    total = count_lines(args.sentence_pair_file)
    written = skipped = 0
    line_no = 1
    stats: dict = {}
    with tqdm(total=total, unit=" pair", disable=args.quiet, file=sys.stderr) as bar:
        for lines in iter_line_chunks(args.sentence_pair_file, args.chunk_lines, args.strict, stats):
            pairs, bad = read_pairs(lines, args.sentence_pair_file, line_no, args.skip_bad_lines)
            scores = model.score_raw_text(pairs, args.batch_size)
            out.write("".join(f"{a}\t{b}\t{s:.6f}\n" for (a, b), s in zip(pairs, scores, strict=True)))
            written, skipped, line_no = written + len(pairs), skipped + bad, line_no + len(lines)
            bar.update(len(lines))
    return written, skipped, stats


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    open_input(args.sentence_pair_file)
    model = load_model(args.load_file, sp_model=args.sp_model, device=args.device)
    if args.output_file:
        remove_stale_temps(args.output_file)  # left by a killed run
    sink = atomic_output(args.output_file, "w") if args.output_file else contextlib.nullcontext(sys.stdout)
    with sink as out:
        written, skipped, stats = score_file(model, args, out)
    if stats["invalid_utf8_lines"]:
        print(f"warning: {stats['invalid_utf8_lines']} lines had invalid UTF-8, replaced by U+FFFD", file=sys.stderr)
    if skipped:
        print(f"skipped {skipped} bad lines (not exactly one tab)", file=sys.stderr)
    print(f"scored {written} pairs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
