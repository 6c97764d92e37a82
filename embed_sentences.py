"""The work of paraphrastic-embed (its options and help: options.embed_args): a file of sentences into an .npy
matrix, one row per line, in order.

The input is streamed in chunks and the rows go into a memory-mapped .npy under a temporary name,
renamed into place only when every row is written: RAM stays bounded for any file size, and an
interrupted run leaves no output that looks complete. `--sentence-file -` reads standard input once, as it comes
(`jq -r .text docs.jsonl | paraphrastic-embed --sentence-file - ...`).

Sharding for job arrays: `--shard I --num-shards N` embeds only the I-th of N contiguous, near-equal
slices of the lines (0-based I) and records which slice in OUT.json beside the output OUT; then
`--concat OUT SHARD_0 ... SHARD_N-1` joins the shard files, checked and in order, into one .npy
(or `open_sharded(paths)` reads them as one matrix without copying).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from paraphrastic import language, load_encoder
from paraphrastic.blocks import block_bytes, estimate_lines, worker_blocks
from paraphrastic.cli import run_cli
from paraphrastic.fileio import (
    InputError,
    atomic_output,
    atomic_path,
    check_room,
    count_lines,
    decode_raw,
    file_digest,
    flushing,
    input_path,
    open_input,
    progress,
    refuse_same_file,
    remove_stale_temps,
    reserve_space,
    set_npy_rows,
    write_npy_rows,
)
from paraphrastic.options import DTYPES
from paraphrastic.options import embed_args as parse_args
from paraphrastic.precision import check_truncate_dim, row_layout, rows_as
from paraphrastic.static import model_path, text_notes, use_torch_for
from paraphrastic.workers import Workers, use_threads, workers_for

PART_FORMAT = "paraphrastic-shard"  # the records of embedding parts (value kept from 0.2; not shards.SHARD_FORMAT)
RECORD_KEYS = {"shard", "num_shards", "start", "stop", "lines", "dim", "dtype"}
STREAM_ROWS = 10**20  # the rows a stream's header says until its end: the most its 21 padded digits hold
UNSAID = {"normalize": False}  # what a shard record written before a key existed means by its absence


def shard_bounds(lines: int, shard: int, num_shards: int) -> tuple[int, int]:
    """First and past-the-end line of slice `shard` of `num_shards` contiguous slices whose sizes differ by <= 1."""
    return shard * lines // num_shards, (shard + 1) * lines // num_shards


def embed_file(
    model,
    sentence_file: str | os.PathLike,
    output_file: str | os.PathLike,
    dtype: str = "float32",
    start: int = 0,
    stop: int | None = None,
    batch_size: int = 8192,
    chunk_lines: int = 16384,
    strict: bool = False,
    quiet: bool = False,
    workers: int | None = None,
    normalize: bool = False,
    truncate_dim: int | None = None,
) -> dict:
    """Embed lines [start, stop) of `sentence_file` (all by default) into the .npy `output_file`, streamed and
    written atomically, by `workers` processes (default: `workers_for`, one a thread but no more than the input's
    blocks) that write their rows into the memory-mapped output; returns stats (`rows`, `invalid_utf8_lines`).
    Standard input (fileio.STDIN) is read once as it comes, its rows counted at its end. The rows are cut to
    `truncate_dim` values, scaled to unit length with `normalize`, then stored as `dtype`, batch by batch in the
    workers (`rows_as`, as encode makes them)."""
    finish = functools.partial(rows_as, normalize=normalize, precision=dtype, dims=truncate_dim)
    workers = workers or workers_for(sentence_file, chunk_lines, start, stop)
    use_torch_for(-(-estimate_lines(sentence_file, start, stop) // workers))  # before the fork: loaded once for all
    with Workers(model, workers) as pool:
        pool.start()  # the workers fork and warm up while the input is planned
        blocks, n = worker_blocks(sentence_file, chunk_lines, start, stop, workers)  # n: None for standard input
        stats: dict = {"rows": n, "invalid_utf8_lines": 0}
        layout = model.no_rows(finish)  # the rows' width and type
        check_room(output_file, (n or 0) * layout.shape[1] * layout.itemsize)
        with npy_output(output_file) as tmp, progress(n, " sent", quiet) as bar:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=layout.dtype, shape=(n or 0, layout.shape[1]))
            del out  # the workers write the rows
            if n is None:
                set_npy_rows(tmp, STREAM_ROWS)  # rows at any place, until the stream's end says how many
            reserve_space(tmp)  # a full disk fails here with a clear error, not with SIGBUS in the memory map
            jobs = ((Path(sentence_file), first, blob, strict, batch_size, tmp, first - 1 - start, finish)
                    for first, blob in blocks)  # fmt: skip
            row = 0
            for rows, job_stats, tokens in pool.map(embed_job, jobs):
                if tokens is not None:  # tokenized by the workers, pooled here on the device
                    write_npy_rows(tmp, tokens[0], finish(model.embed_tokens(*tokens[1:])))
                for key, value in job_stats.items():
                    stats[key] = stats.get(key, 0) + value
                row += rows
                bar.update(rows)
            if n is None:
                set_npy_rows(tmp, row)
                stats["rows"] = row
            elif row != n:
                raise InputError(f"{sentence_file}: read {row} lines but counted {n}; file changed while read?")
    return stats


@contextlib.contextmanager
def npy_output(output_file: str | os.PathLike) -> Iterator[Path]:
    """A regular file to write the .npy into, by rows in any order: the atomic temporary beside `output_file`, or
    for a device or pipe (/dev/null, /dev/stdout, <(...)) a scratch file copied through to it at the end."""
    with atomic_path(output_file) as target:
        if target.is_file():
            with flushing(target):
                yield target
            return
        with tempfile.TemporaryDirectory(prefix="paraphrastic-embed.") as scratch:
            yield Path(scratch) / "rows.npy"
            with open(Path(scratch) / "rows.npy", "rb") as rows, open(target, "wb") as out:
                shutil.copyfileobj(rows, out, 1 << 20)


def embed_job(model, job: tuple) -> tuple[int, dict, tuple | None]:
    """A worker's part of embed_file: decode its lines and write their rows into the output (on a CPU), or
    return their pieces (row, ids, lengths) for the device to pool; returns (lines, stats, pieces or None)."""
    path, first, block, strict, batch_size, out, row, finish = job
    lines, bad = decode_raw(block_bytes(path, block), path, first, strict)
    stats = {"invalid_utf8_lines": bad}
    language.tally(lines, stats)
    if not model.on_cpu:
        ids = model.token_ids(lines)
        model.count_unknown(lines, stats, ids)
        return len(lines), stats, (row, *ids)
    write_npy_rows(out, row, model.embed_here(lines, batch_size, stats=stats, finish=finish))
    return len(lines), stats, None


def record_path(shard_file: str | os.PathLike) -> Path:
    """The JSON record beside a shard file that says which slice of which input it holds."""
    return Path(f"{shard_file}.json")


def file_sha256(path: Path) -> str | None:
    """SHA-256 of a model file (None for a model folder), so that shards from different models are refused."""
    return None if path.is_dir() else file_digest(path)


def embed_shard(model, args: argparse.Namespace) -> dict:
    """Embed this job's slice of the input and write its record beside it (after the .npy, both atomic; the
    record names the rows' checksum, so a rerun killed between the two is caught, and one killed earlier
    leaves the previous shard whole)."""
    lines = count_lines(args.sentence_file)
    start, stop = shard_bounds(lines, args.shard, args.num_shards)
    stats = embed_file(
        model, args.sentence_file, args.output_file, args.dtype, start, stop, args.batch_size, args.chunk_lines,
        args.strict, args.quiet, normalize=args.normalize, truncate_dim=args.truncate_dim,
    )  # fmt: skip
    record = {
        "format": PART_FORMAT,
        "shard": args.shard,
        "num_shards": args.num_shards,
        "start": start,
        "stop": stop,
        "lines": lines,
        "sentence_file": Path(args.sentence_file).name,
        "sentence_file_bytes": os.path.getsize(args.sentence_file),
        "model_sha256": file_sha256(model_path(args.load_file)),
        "dim": model.dim,
        "dtype": args.dtype,
        "normalize": args.normalize,
        "truncate_dim": args.truncate_dim,
        "rows_sha256": file_sha256(Path(args.output_file)),  # a record vouches for these rows alone
    }
    with atomic_output(record_path(args.output_file), "w") as f:
        json.dump(record, f, indent=1)
    return stats


def read_shard(path: Path) -> tuple[dict, np.ndarray]:
    """A shard's record and its rows (memory-mapped), checked against each other."""
    rec_file = record_path(path)
    open_input(path)
    if not rec_file.exists():
        raise InputError(
            f"{path}: no shard record {rec_file.name} beside it (write shards with --shard I --num-shards N)"
        )
    try:
        rec = json.loads(rec_file.read_text(encoding="utf-8"))
        rows = np.load(path, mmap_mode="r")
    except (ValueError, OSError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else e
        raise InputError(f"{path}: unreadable shard or shard record ({reason})") from None
    if not isinstance(rec, dict) or rec.get("format") != PART_FORMAT or not RECORD_KEYS <= rec.keys():
        raise InputError(
            f"{rec_file}: not a complete shard record (format {PART_FORMAT!r}, keys {sorted(RECORD_KEYS)})"
        )
    numbers = ("shard", "num_shards", "start", "stop", "lines", "dim")
    bad = [k for k in numbers if not is_count(rec[k])]
    bad += ["truncate_dim"] if rec.get("truncate_dim") is not None and not is_count(rec["truncate_dim"]) else []
    if bad or rec["dtype"] not in DTYPES:
        what = ", ".join(bad) or f"dtype {rec['dtype']!r}"
        raise InputError(f"{rec_file}: a damaged shard record ({what}); re-run that shard")
    if "rows_sha256" in rec and rec["rows_sha256"] != file_sha256(path):
        raise InputError(f"{path}: not the rows its record {rec_file.name} was written for (an interrupted rerun?); "
                         "re-run that shard")  # fmt: skip
    width, kind = row_layout(rec.get("truncate_dim") or rec["dim"], rec["dtype"])
    if rows.shape != (rec["stop"] - rec["start"], width) or rows.dtype != np.dtype(kind):
        raise InputError(
            f"{path}: holds {rows.shape} {rows.dtype} but its record says "
            f"({rec['stop'] - rec['start']}, {width}) {kind} ({rec['dtype']}); re-run that shard"
        )
    return rec, rows


def said(record: dict, key: str):
    """A shard record's `key`, or what a record written before that key existed means by its absence."""
    return record.get(key, UNSAID.get(key))


def is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_shards(paths: list[str | os.PathLike]) -> list[np.ndarray]:
    """The shards' rows, after checking that they are shards 0..N-1 of one input and one model, in order."""
    paths = [Path(p) for p in paths]
    shards = [read_shard(p) for p in paths]
    first = shards[0][0]
    same = ("num_shards", "lines", "sentence_file", "sentence_file_bytes", "model_sha256", "dim", "dtype",
            "normalize", "truncate_dim")  # fmt: skip
    for i, (path, (rec, _)) in enumerate(zip(paths, shards, strict=True)):
        differ = [key for key in same if said(rec, key) != said(first, key)]
        if differ:
            what = ", ".join(f"{key} {said(rec, key)!r} vs {said(first, key)!r}" for key in differ)
            raise InputError(f"{path}: does not match {paths[0]} ({what}); shards must come from one run")
        if rec["shard"] != i:
            raise InputError(
                f"{path}: is shard {rec['shard']} of {rec['num_shards']} but was given in position {i}; "
                "give the shards in order 0..N-1"
            )
    if len(paths) != first["num_shards"]:
        raise InputError(f"{paths[-1]}: {len(paths)} shards given but the input was cut into {first['num_shards']}")
    return [rows for _, rows in shards]


class ShardedMatrix:
    """Shard files read as one (lines, dim) matrix, memory-mapped: rows are copied only when indexed."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.bounds = np.cumsum([0] + [len(p) for p in parts])
        self.shape = (int(self.bounds[-1]), parts[0].shape[1])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: int | slice | np.ndarray) -> np.ndarray:
        """Rows by index, slice or integer array, gathered from the shards that hold them."""
        if isinstance(rows, int | np.integer):
            return self[np.array([rows])][0]
        rows = np.arange(len(self))[rows]  # slices, negative indices and masks as numpy reads them
        part = np.searchsorted(self.bounds, rows, side="right") - 1
        out = np.empty((len(rows), self.shape[1]), dtype=self.dtype)
        for i in np.unique(part):
            pick = part == i
            out[pick] = self.parts[i][rows[pick] - self.bounds[i]]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.concatenate(self.parts).astype(dtype or self.dtype, copy=False)


def open_sharded(paths: list[str | os.PathLike]) -> ShardedMatrix:
    """Shard files written with --shard, checked and given in order 0..N-1, as one read-only matrix."""
    return ShardedMatrix(check_shards(paths))


def concat_shards(paths: list[str | os.PathLike], output_file: str | os.PathLike, chunk_rows: int = 262144) -> int:
    """Join shard files (checked, in order) into one .npy, streamed and written atomically; returns the rows."""
    parts = check_shards(paths)
    rows = sum(len(p) for p in parts)
    check_room(output_file, rows * parts[0].shape[1] * parts[0].dtype.itemsize)
    with npy_output(output_file) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=parts[0].dtype, shape=(rows, parts[0].shape[1]))
        reserve_space(tmp)
        at = 0
        for part in parts:
            for i in range(0, len(part), chunk_rows):
                block = part[i : i + chunk_rows]
                out[at : at + len(block)] = block
                at += len(block)
        out.flush()
        del out
    return rows


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.engine == "ray":
        shape = {"normalize": args.normalize} if args.normalize else {}  # a run's options as before, unless asked
        shape |= {"truncate_dim": args.truncate_dim} if args.truncate_dim else {}
        from paraphrastic import ray_engine  # here: a local run needs none of it (0.02 s of imports)

        return ray_engine.main_files(args, "embed", text_column=args.text_column, dtype=args.dtype, **shape)
    if args.concat:
        out, *paths = args.concat
        refuse_same_file(out, *paths)
        remove_stale_temps(out)
        rows = concat_shards(paths, out)
        print(f"wrote {rows} rows from {len(paths)} shards to {out}", file=sys.stderr)
        return 0
    use_threads(args.threads)
    source = input_path(args.sentence_file)
    open_input(source, stream=args.sentence_file == "-")
    refuse_same_file(args.output_file, source, model_path(args.load_file), args.sp_model)
    model = load_encoder(args.load_file, sp_model=args.sp_model, device=args.device)
    check_truncate_dim(model.dim, args.truncate_dim)
    gc.freeze()  # the modules and the model live to the end: the collections of a long run skip them
    remove_stale_temps(args.output_file)  # left by a killed run
    if args.shard is not None:
        stats = embed_shard(model, args)
    else:
        stats = embed_file(
            model, source, args.output_file, args.dtype, batch_size=args.batch_size,
            chunk_lines=args.chunk_lines, strict=args.strict, quiet=args.quiet, normalize=args.normalize,
            truncate_dim=args.truncate_dim,
        )  # fmt: skip
    for note in text_notes(model, stats, args.load_file):
        print(note, file=sys.stderr)
    where = "" if args.shard is None else f" (shard {args.shard} of {args.num_shards})"
    dim = args.truncate_dim or model.dim
    packed = f" ({row_layout(dim, args.dtype)[0]} bytes a row)" if args.dtype.endswith("binary") else ""
    unit = " unit-length" if args.normalize else ""
    print(f"wrote {stats['rows']} x {dim}{unit} {args.dtype} embeddings{packed}{where} to {args.output_file}",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
