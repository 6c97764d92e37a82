"""Training pairs: read from a TSV of raw pairs (tokenized once into memory) or from HDF5 shards (one window
at a time), and served by one seeded sampler, so that a position in an epoch names the same pair whatever the
source and however often a run was resumed."""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from paraphrastic.fileio import InputError, decode_raw, iter_line_blocks, open_input, split_pair
from paraphrastic.models import Model
from paraphrastic.shards import Shard, span_positions

BLOCK_PAIRS = 32  # contiguous pairs read at once: the sampler's unit of disk access
WINDOW_PAIRS = 65536  # pairs shuffled together: a window of randomly chosen blocks


class PairData:
    """A block of sentence pairs: flat int64 ids and per-sentence lengths for each side, and each pair's paraphrase
    group (`groups`, int64, -1 for none; None where the source has no groups): a sentence is never mined as a
    negative of a sentence of its own group."""

    def __init__(
        self, src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray], groups: np.ndarray | None = None
    ):
        self.src, self.tgt, self.groups = src, tgt, groups

    def __len__(self) -> int:
        return len(self.src[1])

    def take(self, idx: np.ndarray) -> PairData:
        """The pairs at `idx`, in that order."""
        groups = None if self.groups is None else self.groups[idx]
        return PairData(take_bags(*self.src, idx), take_bags(*self.tgt, idx), groups)

    @staticmethod
    def concat(parts: list[PairData]) -> PairData:
        sides = [tuple(np.concatenate([getattr(p, side)[k] for p in parts]) for k in (0, 1)) for side in ("src", "tgt")]
        grouped = [p.groups for p in parts if len(p)]  # an empty part's groups do not matter
        if not grouped or any(g is None for g in grouped):
            return PairData(*sides)
        return PairData(*sides, np.concatenate(grouped))


def take_bags(flat: np.ndarray, lengths: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gather sentences `idx` from (flat ids, lengths) without a Python loop over sentences."""
    lens = lengths[idx]
    return flat[span_positions((np.cumsum(lengths) - lengths)[idx], lens)], lens


class MemorySource:
    """Tokenized pairs held in memory, read like a shard: contiguous ranges of pairs; `groups`: each pair's group
    (PairData's), or None."""

    def __init__(
        self, src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray], groups: np.ndarray | None = None
    ):
        self.sides = [(ids.astype(np.int32), np.concatenate([[0], np.cumsum(lens)])) for ids, lens in (src, tgt)]
        self.groups = groups

    def __len__(self) -> int:
        return len(self.sides[0][1]) - 1

    def read(self, start: int, stop: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        out = []
        for ids, offsets in self.sides:
            off = offsets[start : stop + 1]
            out.append((ids[off[0] : off[-1]].astype(np.int64), np.diff(off)))
        return tuple(out)

    def read_many(self, starts: np.ndarray, stops: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """read's pairs of every range [starts[i], stops[i]), concatenated in that order."""
        idx = span_positions(starts, stops - starts)
        return tuple((ids.astype(np.int64), lengths) for ids, lengths in
                     (take_bags(ids, np.diff(offsets), idx) for ids, offsets in self.sides))  # fmt: skip


class ShardSet:
    """Several HDF5 shards read as one sequence of pairs; each is checked against the sentencepiece model."""

    def __init__(self, paths: list[Path], sp_model: bytes):
        self.shards = [Shard(p, sp_model=sp_model) for p in paths]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        lowercase = {s.lowercase for s in self.shards}
        if len(lowercase) > 1:
            raise InputError(f"{paths[0].parent}: the shards disagree on lowercasing; encode them all the same way")
        self.lowercase = lowercase.pop()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, stop: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        parts = []
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        for k in range(first, len(self.shards)):
            lo, hi = max(start, self.starts[k]), min(stop, self.starts[k + 1])
            if lo >= hi:
                break
            parts.append(PairData(*self.shards[k].read(int(lo - self.starts[k]), int(hi - self.starts[k]))))
        block = parts[0] if len(parts) == 1 else PairData.concat(parts)
        return block.src, block.tgt

    def read_many(self, starts: np.ndarray, stops: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """read's pairs of every range [starts[i], stops[i]), concatenated in that order: each range cut at the
        shards' bounds, each shard's pieces read at once (Shard.read_many), then put in the ranges' order."""
        pieces = []  # (shard, first pair, end) within the shard, in the ranges' order
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            k = int(np.searchsorted(self.starts, a, side="right")) - 1
            while a < b:
                end = min(b, int(self.starts[k + 1]))
                pieces.append((k, a - int(self.starts[k]), end - int(self.starts[k])))
                a, k = end, k + 1
        if not pieces:  # every range empty
            return (np.zeros(0, np.int64), np.zeros(0, np.int64)), (np.zeros(0, np.int64), np.zeros(0, np.int64))
        shard, lo, hi = (np.array(column, dtype=np.int64) for column in zip(*pieces, strict=True))
        parts = [PairData(*self.shards[k].read_many(lo[shard == k], hi[shard == k])) for k in np.unique(shard).tolist()]
        block = parts[0] if len(parts) == 1 else PairData.concat(parts)
        by_shard = np.argsort(shard, kind="stable")  # the pieces' order in `block`
        if (by_shard != np.arange(len(pieces))).any():  # pieces of several shards interleaved: back to their order
            counts = (hi - lo)[by_shard]
            at = np.empty(len(pieces), dtype=np.int64)
            at[by_shard] = np.cumsum(counts) - counts  # where each piece's pairs start in `block`
            block = block.take(span_positions(at, hi - lo))
        return block.src, block.tgt


class PairSampler:
    """The seeded order of an epoch: windows of randomly chosen blocks of contiguous pairs, shuffled within.

    Position `offset` in epoch `epoch` names the same pair whatever the source (memory or shards) and
    however often the run was resumed; only the current windows are held in memory.
    """

    def __init__(self, source, seed: int, block: int = BLOCK_PAIRS, window: int = WINDOW_PAIRS):
        self.source, self.seed, self.block = source, seed, block
        self.blocks_per_window = max(1, window // block)
        self.num_blocks = math.ceil(len(source) / block)
        self._epoch = None
        self._windows: dict[int, PairData] = {}

    def __len__(self) -> int:
        return len(self.source)

    def read(self, epoch: int, start: int, count: int) -> PairData:
        """Pairs [start, start + count) of the epoch's order (fewer at the end of the epoch)."""
        self._plan(epoch)
        stop = min(start + count, len(self))
        parts = []
        while start < stop:
            w = int(np.searchsorted(self.window_starts, start, side="right")) - 1
            lo, hi = start - self.window_starts[w], min(stop, self.window_starts[w + 1]) - self.window_starts[w]
            data = self._window(epoch, w)
            parts.append(data.take(np.arange(lo, hi)))
            start += hi - lo
        return parts[0] if len(parts) == 1 else PairData.concat(parts)

    def _plan(self, epoch: int) -> None:
        if self._epoch == epoch:
            return
        self._epoch, self._windows = epoch, {}
        self.order = np.random.default_rng([self.seed, epoch, 0]).permutation(self.num_blocks)
        sizes = np.minimum(self.block, len(self) - self.order * self.block)
        per_window = np.add.reduceat(sizes, np.arange(0, self.num_blocks, self.blocks_per_window))
        self.window_starts = np.concatenate([[0], np.cumsum(per_window)])

    def _window(self, epoch: int, w: int) -> PairData:
        if w not in self._windows:
            blocks = self.order[w * self.blocks_per_window : (w + 1) * self.blocks_per_window]
            starts = blocks.astype(np.int64) * self.block
            stops = np.minimum(starts + self.block, len(self))
            data = PairData(*self.source.read_many(starts, stops))
            if getattr(self.source, "groups", None) is not None:  # a TSV's third column (shards have none)
                data.groups = self.source.groups[span_positions(starts, stops - starts)]
            perm = np.random.default_rng([self.seed, epoch, 1, w]).permutation(len(data))
            self._windows = {k: v for k, v in self._windows.items() if k == w - 1}
            self._windows[w] = data.take(perm)
        return self._windows[w]


def iter_pairs(
    path: Path, skip_bad: bool, chunk_lines: int = 65536
) -> Iterator[tuple[list[str], list[str], list[str | None]]]:
    """Yield (sources, targets, groups) chunks of a `s1<TAB>s2` file (.gz accepted), bounded in lines and bytes; a
    line may name its pair's paraphrase group by a whole number in a third column (`s1<TAB>s2<TAB>GROUP`; None
    where it does not); a bad line is an InputError."""
    try:
        for line_no, blob in iter_line_blocks(path, chunk_lines):
            src, tgt, groups = [], [], []
            for i, text in enumerate(decode_raw(blob, path, line_no, strict=False)[0]):
                try:
                    s, t, group = split_grouped_pair(text, path, line_no + i)
                except InputError:
                    if skip_bad:
                        continue
                    raise
                src.append(s)
                tgt.append(t)
                groups.append(group)
            yield src, tgt, groups
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InputError(f"{path}: not a readable gzip file, truncated or corrupt ({e})") from None


def split_grouped_pair(line: str, path: Path, line_no: int) -> tuple[str, str, str | None]:
    """`s1<TAB>s2`, or `s1<TAB>s2<TAB>GROUP` with GROUP a whole number (anything else in a third column is
    split_pair's error, which names an STS file's `score<TAB>s1<TAB>s2`)."""
    parts = line.split("\t")
    if len(parts) == 3 and parts[2].isascii() and parts[2].isdigit():
        return parts[0], parts[1], parts[2]
    return *split_pair(line, path, line_no), None


def tokenize_pairs(path: Path, model: Model, skip_bad: bool, threads: int) -> MemorySource:
    """Tokenize a TSV of pairs chunk by chunk into a MemorySource of the model's token ids, with the pairs'
    groups numbered in order of first appearance where any line names one."""
    sides: list[list[tuple[np.ndarray, np.ndarray]]] = [[], []]
    numbers: dict[str, int] = {}
    groups: list[int] = []
    for *chunk, named in iter_pairs(path, skip_bad):
        for side, texts in zip(sides, chunk, strict=True):
            ids, lens = model.token_ids(texts, num_threads=threads)
            side.append((ids.astype(np.int32), lens))
        groups += [-1 if g is None else numbers.setdefault(g, len(numbers)) for g in named]
    src, tgt = ((np.concatenate([a for a, _ in s] or [[]]), np.concatenate([b for _, b in s] or [[]])) for s in sides)
    return MemorySource(src, tgt, np.array(groups, dtype=np.int64) if numbers else None)


def shard_paths(items: list[str]) -> list[Path]:
    """Shard files named directly or found (*.h5, *.hdf5) in the directories named."""
    paths = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.suffix in (".h5", ".hdf5"))
            if not found:
                raise InputError(f"{item}: no *.h5 or *.hdf5 shards in this directory")
            paths += found
        else:
            open_input(item)
            paths.append(item)
    return paths
