"""Embed a file of sentences (one per line) into an .npy matrix, one row per line, in order.

The input is streamed in chunks and the rows go into a memory-mapped .npy under a temporary name,
renamed into place only when every row is written: RAM stays bounded for any file size, and an
interrupted run leaves no output that looks complete.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from tqdm import tqdm

from fileio import atomic_path, count_lines, iter_line_chunks, open_input, remove_stale_temps, reserve_space, run_cli
from models import load_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentence-file", required=True, help="UTF-8 text, one sentence per line")
    p.add_argument("--load-file", help="model file (default: the shipped English model)")
    p.add_argument("--sp-model", help="sentencepiece model, only for original-toolkit model files")
    p.add_argument("--output-file", required=True, help="output .npy, shape (lines, dim)")
    p.add_argument("--batch-size", type=int, default=8192, help="sentences per tokenize+pool step")
    p.add_argument("--chunk-lines", type=int, default=262144, help="lines read from disk at a time")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--threads", type=int, help="CPU threads for tokenizing and pooling (default: all)")
    p.add_argument("--strict", action="store_true", help="fail on invalid UTF-8 instead of replacing it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def embed_file(model, args: argparse.Namespace) -> tuple[int, dict]:
    """Stream `args.sentence_file` through the model into `args.output_file`; returns (rows, stats)."""
    open_input(args.sentence_file)
    n = count_lines(args.sentence_file)
    stats: dict = {}
    with atomic_path(args.output_file) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=args.dtype, shape=(n, model.dim))
        reserve_space(tmp)  # a full disk fails here with a clear error, not with SIGBUS in the memory map
        row = 0
        with tqdm(total=n, unit=" sent", disable=args.quiet, file=sys.stderr) as bar:
            for lines in iter_line_chunks(args.sentence_file, args.chunk_lines, args.strict, stats):
                out[row : row + len(lines)] = model.embed_raw_text(lines, args.batch_size)
                row += len(lines)
                bar.update(len(lines))
        if row != n:
            raise RuntimeError(f"{args.sentence_file}: read {row} lines but counted {n}; file changed while read?")
        out.flush()
        del out
    return n, stats


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.load_file, sp_model=args.sp_model, device=args.device)
    remove_stale_temps(args.output_file)  # left by a killed run
    n, stats = embed_file(model, args)
    if stats["invalid_utf8_lines"]:
        print(f"warning: {stats['invalid_utf8_lines']} lines had invalid UTF-8, replaced by U+FFFD", file=sys.stderr)
    print(f"wrote {n} x {model.dim} {args.dtype} embeddings to {args.output_file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
