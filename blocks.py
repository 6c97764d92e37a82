"""A text file cut into blocks of whole lines for worker processes: planned ahead in one pass of vectorised newline
search that keeps no text (by threads side by side on a large file), each worker then reading its own block by
offset, so the process feeding them ships no text; where the lines of a file start, for readers on other machines.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from paraphrastic.fileio import (
    JOB_BYTES,
    LINE_LIMIT_ENV,
    STDIN,
    InputError,
    count_lines,
    iter_line_blocks,
    line_limit,
    open_binary,
    open_input,
    reading,
    refuse_binary,
    skip_lines,
)

SPAN_BYTES = 16 << 20  # the least text one thread plans alone (line_plan): less is not worth a thread
TAIL_SPLIT = 4  # a plan's last blocks, one a worker, are cut this many times finer: the workers then end within
# a quarter of a job of each other, not a whole job (a third of a second, at 16 workers)


def line_plan(
    path: str | os.PathLike,
    chunk_lines: int,
    start: int = 0,
    stop: int | None = None,
    chunk_bytes: int = JOB_BYTES,
    threads: int = 1,
) -> list[tuple[int, int, int, int]]:
    """(number of the first line, byte offset, byte length, lines) of the blocks of lines [start, stop) of a plain
    file, each at most `chunk_lines` lines and `chunk_bytes` bytes (or one line), from vectorised newline search that
    keeps no text: worker processes then read their own blocks, and the process that feeds them ships none. The
    bytes are cut at line starts into parts that `threads` threads plan side by side (numpy lets go of the GIL), so
    that on many cores planning 8M lines is no longer a third of a second before any worker starts. A line over the
    limit is refused here."""
    with reading(Path(path)), open(path, "rb") as f:
        skip_lines(f, start)
        lo = f.tell()
        if stop is None:
            f.seek(0, os.SEEK_END)
        else:
            skip_lines(f, stop - start)
        hi = f.tell()
        cuts = line_starts(f, lo, hi, max(1, min(threads, (hi - lo) // SPAN_BYTES)))
        spans = list(zip(cuts, cuts[1:], strict=False))
        with cf.ThreadPoolExecutor(len(spans)) as pool:
            planned = list(pool.map(lambda span: plan_span(path, *span, chunk_lines, chunk_bytes), spans))
    plan, line = [], start + 1
    for blocks, lines, too_long in planned:
        if too_long is not None:
            raise InputError(f"{path}:{line + too_long}: a line of more than {line_limit():,} bytes, the limit (is it "
                             f"text? if so, raise {LINE_LIMIT_ENV})")  # fmt: skip
        plan += [(line + first, offset, size, n) for first, offset, size, n in blocks]
        line += lines
    if threads > 1 and len(plan) > threads:  # the last `threads` blocks cut finer, so that the workers end together
        (line, lo, *_), (_, at, size, _) = plan[-threads], plan[-1]  # re-planned: from the first of them to the end
        tail = plan_span(path, lo, at + size, max(1, chunk_lines // TAIL_SPLIT), max(1, chunk_bytes // TAIL_SPLIT))[0]
        plan[-threads:] = [(line + first, offset, size, n) for first, offset, size, n in tail]
    return plan


def line_starts(f: BinaryIO, lo: int, hi: int, parts: int) -> list[int]:
    """`lo`, the line start at or after each of `parts` - 1 even cuts of bytes [lo, hi), and `hi`: where independent
    planners of one file begin."""
    cuts = [lo]
    for k in range(1, parts):
        at = next_line_start(f, max(lo + (hi - lo) * k // parts, cuts[-1] + 1), hi)
        if at >= hi:
            break
        cuts.append(at)
    return cuts + [hi]


def next_line_start(f: BinaryIO, at: int, hi: int) -> int:
    """The first line start at or after byte `at` (0 < `at`), or `hi` when none comes before it or within the line
    limit (that line is then refused by the planner of the part that holds it)."""
    f.seek(at - 1)  # a newline just before `at` makes it a line start
    end = min(hi, at + line_limit())
    while at < end and (data := f.read(1 << 16)):
        if (newline := data.find(b"\n")) >= 0:
            return min(at + newline, hi)
        at += len(data)
    return hi


def plan_span(
    path: str | os.PathLike, lo: int, hi: int, chunk_lines: int, chunk_bytes: int
) -> tuple[list[tuple[int, int, int, int]], int, int | None]:
    """line_plan of bytes [lo, hi), which begin at a line start: (the blocks, their first lines counted from 0 at
    `lo`; the lines; the first line over the limit, counted likewise, or None)."""
    limit, plan = line_limit(), []
    with open(path, "rb") as f:
        f.seek(lo)
        begin = tail = last = at = lo  # the block's start, the line being read's, the last taken's end, a read's
        line, taken, seen = 0, 0, 0  # the block's first line; the lines it holds; the lines found
        while True:
            data = f.read(min(1 << 20, hi - at))
            ends = at + np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
            if not data and at > tail:
                ends = np.array([at - 1])  # the last line has no newline: it ends with the file
            sizes = np.diff(ends + 1, prepend=tail)
            if (sizes > limit).any() or at + len(data) - (int(ends[-1]) + 1 if len(ends) else tail) > limit:
                return plan, seen, seen + (int(np.argmax(sizes > limit)) if (sizes > limit).any() else len(ends))
            tail, seen, i = int(ends[-1]) + 1 if len(ends) else tail, seen + len(ends), 0
            while i < len(ends):
                room = int(min(chunk_lines - taken, len(ends) - i))
                fit = int(np.searchsorted(ends[i : i + room], begin + chunk_bytes - 1, side="right"))
                k = fit if fit or taken else 1  # whole lines within the budget, at least one
                if k:
                    taken, i, last = taken + k, i + k, int(ends[i + k - 1]) + 1
                if k < room or taken == chunk_lines:
                    plan.append((line, begin, last - begin, taken))
                    line, begin, taken = line + taken, last, 0
            at += len(data)
            if not data:
                break
    if taken:
        plan.append((line, begin, last - begin, taken))
    return plan, seen, None


def worker_blocks(
    path: str | os.PathLike, chunk_lines: int, start: int = 0, stop: int | None = None, threads: int = 1
) -> tuple[Iterator[tuple[int, bytes | tuple[int, int]]], int | None]:
    """The blocks of lines [start, stop) for worker processes, and how many lines they hold: for a plain file
    (first line, (offset, length)), planned by `threads` threads in one pass, which each worker reads itself
    (`block_bytes`), so the process feeding them reads the file once and ships no text; for a .gz, which cannot be
    read from the middle, (first line, the bytes); for standard input (STDIN), the bytes, read once as they come,
    and None lines (not known before its end)."""
    path = Path(path)
    if path == STDIN:
        return iter_line_blocks(path, chunk_lines, start, stop, stream=True), None
    open_input(path)
    if path.suffix == ".gz":
        stop = count_lines(path) if stop is None else stop
        return iter_line_blocks(path, chunk_lines, start, stop), max(stop - start, 0)
    if not start:
        with reading(path), open(path, "rb") as f:
            refuse_binary(path, f.read(8192))
    plan = line_plan(path, chunk_lines, start, stop, threads=threads)
    return ((first, (offset, size)) for first, offset, size, _ in plan), sum(lines for *_, lines in plan)


def estimate_lines(path: str | os.PathLike, start: int = 0, stop: int | None = None) -> int:
    """About how many lines [start, stop) of a text file holds, from its size and the lines of its first 64 KiB (of
    a .gz, its packed size: low): enough to choose a kernel before the workers start and the lines are counted.
    Standard input: none, since its bytes can be read only once (its workers choose as they go)."""
    if stop is not None:
        return max(0, stop - start)
    if Path(path) == STDIN:
        return 0
    with reading(Path(path)), open_binary(Path(path)) as f:
        head = f.read(1 << 16)
    return max(0, os.path.getsize(path) * (head.count(b"\n") + 1) // max(1, len(head)) - start)


def block_bytes(path: str | os.PathLike, block: bytes | tuple[int, int]) -> bytes:
    """A worker's block: the bytes themselves, or read from (offset, length) of the file."""
    if isinstance(block, bytes):
        return block
    with open(path, "rb") as f:
        return os.pread(f.fileno(), block[1], block[0])


def line_offsets(path: str | os.PathLike, every: int, block: int = 1 << 20) -> tuple[list[tuple[int, int]], int]:
    """(line, byte offset) of line 0 and of every `every`-th line after it in a plain text file, and its number of
    lines (a last line without a newline counts), from one pass of vectorised newline counting: where independent
    readers of one file can start, and where they end."""
    marks, lines, last = [(0, 0)], 0, b"\n"
    with reading(Path(path)), open(path, "rb") as f:
        at = 0
        while data := f.read(block):
            ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
            for k in range((lines // every + 1) * every, lines + len(ends) + 1, every):
                marks.append((k, at + int(ends[k - lines - 1]) + 1))
            lines, at, last = lines + len(ends), at + len(data), data[-1:]
    return [(line, offset) for line, offset in marks if offset < at or line == 0], lines + (last != b"\n")
