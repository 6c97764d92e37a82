"""The work of paraphrastic-score (its options and help: options.score_args): sentence pairs scored by the cosine
of their embeddings.

Output line i is `sentence1<TAB>sentence2<TAB>score` of input line i. A line without exactly one tab is
an error naming its line number, unless --skip-bad-lines, which gives it the score `nan` (its text, tabs
turned to spaces, as sentence1) and lists its line number. A pair with an empty side scores `nan` too.
`--sentence-pair-file -` reads the pairs from a pipe as they come (`generate | paraphrastic-score ...`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys

from paraphrastic import language, load_encoder
from paraphrastic.blocks import block_bytes, estimate_lines, worker_blocks
from paraphrastic.cli import run_cli
from paraphrastic.fileio import (
    SHOWN,
    atomic_output,
    bad_pairs_note,
    decode_raw,
    input_path,
    open_input,
    parse_pair_lines,
    progress,
    refuse_same_file,
    remove_stale_temps,
)
from paraphrastic.options import score_args as parse_args
from paraphrastic.static import model_path, pair_cosines, sides, text_notes, use_torch_for
from paraphrastic.workers import Workers, threads, use_threads, workers_for


def score_file(model, args: argparse.Namespace, out) -> tuple[int, list[int], int, dict]:
    """Score every line of the input into `out`, row for row, by --threads worker processes (a model on a GPU
    scores in this process); returns (lines written, the first SHOWN bad line numbers, pairs with an empty side,
    stats: `bad_lines` counts them all, so that memory stays flat however many there are)."""
    path = input_path(args.sentence_pair_file)
    workers = workers_for(path, args.chunk_lines) if model.on_cpu else 1
    use_torch_for(-(-2 * estimate_lines(path) // workers))  # before the fork: loaded once for all
    written = empty = 0
    bad: list[int] = []
    stats: dict = {"invalid_utf8_lines": 0, "bad_lines": 0}
    with Workers(model, workers) as pool:
        pool.start()  # the workers fork and warm up while the input is planned
        blocks, total = worker_blocks(path, args.chunk_lines, threads=threads())  # total: None for standard input
        jobs = ((path, first, blob, args.strict, args.skip_bad_lines, args.batch_size) for first, blob in blocks)
        with progress(total, " pair", args.quiet) as bar:
            for text, lines, chunk_bad, chunk_empty, chunk_stats in pool.map(score_job, jobs):
                out.write(text)
                out.flush()  # a reader downstream of a pipe gets each block as it is scored
                for key, value in chunk_stats.items():
                    stats[key] = stats.get(key, 0) + value
                written, bad, empty = written + lines, bad + chunk_bad[: SHOWN - len(bad)], empty + chunk_empty
                stats["bad_lines"] += len(chunk_bad)
                bar.update(lines)
    return written, bad, empty, stats


def score_job(model, job: tuple) -> tuple[str, int, list[int], int, dict]:
    """A worker's part of score_file: (output text, lines, bad line numbers, pairs with an empty side, stats)."""
    path, first, block, strict, skip_bad, batch_size = job
    lines, invalid = decode_raw(block_bytes(path, block), path, first, strict)
    pairs, bad = parse_pair_lines(lines, path, first, skip_bad)
    stats = {"invalid_utf8_lines": invalid}
    texts = sides(pairs)
    language.tally(texts, stats)
    scores = pair_cosines(pairs, model.embed_here(texts, batch_size, stats=stats))  # unknown pieces counted there
    text = "".join(f"{a}\t{b}\t{s:.6f}\n" for (a, b), s in zip(pairs, scores, strict=True))
    return text, len(lines), bad, sum(s != s for s in scores) - len(bad), stats


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.engine == "ray":
        from paraphrastic import ray_engine  # here: a local run needs none of it (0.02 s of imports)

        return ray_engine.main_files(args, "score", score=True, skip_bad=args.skip_bad_lines)
    use_threads(args.threads)
    source = input_path(args.sentence_pair_file)
    open_input(source, stream=args.sentence_pair_file == "-")
    refuse_same_file(args.output_file, source, model_path(args.load_file), args.sp_model)
    model = load_encoder(args.load_file, sp_model=args.sp_model, device=args.device)
    gc.freeze()  # the modules and the model live to the end: the collections of a long run skip them
    if args.output_file:
        remove_stale_temps(args.output_file)  # left by a killed run
    sink = atomic_output(args.output_file, "w") if args.output_file else contextlib.nullcontext(sys.stdout)
    with sink as out:
        written, bad, empty, stats = score_file(model, args, out)
    for note in text_notes(model, stats, args.load_file):
        print(note, file=sys.stderr)
    if bad:
        print(bad_pairs_note(stats["bad_lines"], bad), file=sys.stderr)
    if empty:
        print(f"{empty} pairs with an empty side scored nan", file=sys.stderr)
    print(f"scored {written} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
