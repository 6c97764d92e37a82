"""HDF5 training shards: sentence pairs as flat int32 sentencepiece ids plus offsets.

One shard file holds N pairs. Datasets: `src_ids`, `tgt_ids` (int32, all ids of that side
concatenated) and `src_offsets`, `tgt_offsets` (int64, N + 1 entries: pair i's ids are
`ids[offsets[i]:offsets[i + 1]]`). Attributes record the sentencepiece model's SHA-256 and the
lowercasing, so a shard is never trained with a tokenizer it was not made with.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import h5py
import numpy as np
import sentencepiece as spm

from paraphrastic.fileio import InputError, atomic_path

SHARD_FORMAT = "paraphrastic-shard"
MAX_PIECES = 1 << 16  # pieces in one sentence; more is a damaged offsets table, not text
MEAN_PIECES = 1024  # nor are more than this many per sentence on average (reads stay bounded in memory)
SPAN_GAP = 32 << 10  # bytes between two spans read through: about what is read in the time of one h5py call
SHARD_VERSION = 1


def span_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions of every span [starts[i], starts[i] + lengths[i]), concatenated in order, with no Python loop."""
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


def sp_checksum(sp_model: bytes) -> str:
    """SHA-256 of a serialized sentencepiece model: the identity a shard is checked against."""
    return hashlib.sha256(sp_model).hexdigest()


def write_shard(
    path: str | os.PathLike,
    src: tuple[np.ndarray, np.ndarray],
    tgt: tuple[np.ndarray, np.ndarray],
    sp_model: bytes,
    lowercase: bool,
) -> None:
    """Write pairs given as (flat ids, per-sentence lengths) for each side, atomically."""
    (src_ids, src_len), (tgt_ids, tgt_len) = src, tgt
    if len(src_len) != len(tgt_len):
        raise ValueError(f"{len(src_len)} source sentences but {len(tgt_len)} target sentences")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for side, ids, lengths in (("src", src_ids, src_len), ("tgt", tgt_ids, tgt_len)):
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            f.create_dataset(f"{side}_ids", data=np.asarray(ids, dtype=np.int32), chunks=True)
            f.create_dataset(f"{side}_offsets", data=offsets, chunks=True)
        f.attrs.update(
            format=SHARD_FORMAT,
            format_version=SHARD_VERSION,
            sp_sha256=sp_checksum(sp_model),
            lowercase=lowercase,
            num_pairs=len(src_len),
        )


class Shard:
    """Read access to one shard: contiguous ranges of pairs, never the whole file at once."""

    def __init__(self, path: str | os.PathLike, sp_model: bytes | None = None):
        self.path = Path(path)
        try:
            self.file = h5py.File(self.path, "r")
            attrs = dict(self.file.attrs)
            self.offsets = {side: self.file[f"{side}_offsets"] for side in ("src", "tgt")}
            self.ids = {side: self.file[f"{side}_ids"] for side in ("src", "tgt")}
        except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:  # whatever h5py makes of damage
            raise InputError(f"{self.path}: not a readable training shard ({e})") from None
        if attrs.get("format") != SHARD_FORMAT:
            raise InputError(f"{self.path}: not a training shard (no '{SHARD_FORMAT}' format attribute)")
        missing = [k for k in ("sp_sha256", "lowercase", "num_pairs") if k not in attrs]
        if missing:
            raise InputError(f"{self.path}: damaged training shard (attributes {missing} are missing)")
        try:
            self.sp_sha256 = str(attrs["sp_sha256"])
            self.lowercase = bool(attrs["lowercase"])
            self.num_pairs = int(attrs["num_pairs"])
            self._check_layout()
        except (OSError, RuntimeError, ValueError, TypeError) as e:
            raise InputError(f"{self.path}: damaged training shard ({e})") from None
        if sp_model is not None and self.sp_sha256 != sp_checksum(sp_model):
            raise InputError(
                f"{self.path}: made with another sentencepiece model (checksum {self.sp_sha256[:12]}, "
                f"expected {sp_checksum(sp_model)[:12]}); re-encode it or pass the matching --sp-model"
            )
        self.pieces = spm.SentencePieceProcessor(model_proto=sp_model).get_piece_size() if sp_model else 2**31

    def _check_layout(self) -> None:
        """Offsets must span the ids exactly, one more than the pairs, so that a damaged or truncated
        shard is refused when opened rather than failing (or feeding garbage) in the middle of training."""
        for side in ("src", "tgt"):
            offsets, ids = self.offsets[side], self.ids[side]
            datasets = isinstance(offsets, h5py.Dataset) and isinstance(ids, h5py.Dataset) and len(ids.shape) == 1
            if not datasets or offsets.shape != (self.num_pairs + 1,):
                raise InputError(f"{self.path}: damaged training shard ({side} offsets do not match num_pairs)")
            for dataset in (offsets, ids):
                if dataset.dtype.kind not in "iu":
                    raise InputError(
                        f"{self.path}: damaged training shard ({dataset.name} holds {dataset.dtype}, not integers)"
                    )
                if dataset.is_virtual or dataset.external:
                    raise InputError(
                        f"{self.path}: {dataset.name} keeps its data outside the shard; encode the shard again"
                    )
            first, last = int(self._read(offsets, 0)), int(self._read(offsets, self.num_pairs))
            if first != 0 or last != ids.shape[0]:
                raise InputError(f"{self.path}: damaged training shard ({side} offsets do not span the ids)")

    def _read(self, dataset: h5py.Dataset, index) -> np.ndarray:
        """dataset[index]; a read error (a damaged file) is an InputError naming the shard."""
        try:
            return dataset[index]
        except (OSError, ValueError, TypeError, RuntimeError) as e:
            raise InputError(f"{self.path}: damaged training shard, cannot read {dataset.name} ({e})") from None

    def __len__(self) -> int:
        return self.num_pairs

    def read(self, start: int, stop: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Pairs [start, stop) as ((src flat ids, src lengths), (tgt flat ids, tgt lengths))."""
        sides = []
        for side in ("src", "tgt"):
            offsets = self._read(self.offsets[side], slice(start, stop + 1)).astype(np.int64)
            claimed = offsets[-1] - offsets[0]
            if (np.diff(offsets) > MAX_PIECES).any() or claimed > MAX_PIECES + MEAN_PIECES * (stop - start):
                raise InputError(
                    f"{self.path}: damaged training shard (pairs {start}-{stop} claim {claimed:,} pieces; "
                    "no text is that long)"
                )
            ids = self._read(self.ids[side], slice(offsets[0], offsets[-1])).astype(np.int64)
            lengths = np.diff(offsets)
            if (lengths < 0).any() or (len(ids) and not 0 <= ids.min() <= ids.max() < self.pieces):
                raise InputError(
                    f"{self.path}: damaged training shard (ids or lengths out of range, pairs {start}-{stop})"
                )
            sides.append((ids, lengths))
        return sides[0], sides[1]

    def read_many(self, starts: np.ndarray, stops: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """What read gives for each range [starts[i], stops[i]), concatenated in that order, with the same checks,
        each dataset read in a few ascending runs (h5py's own work for one small read outweighs its bytes, and a
        sampler's window is 2,048 ranges)."""
        pairs = stops - starts
        sides = []
        for side in ("src", "tgt"):
            offsets = self._read_spans(self.offsets[side], starts, stops + 1).astype(np.int64)
            ends = np.cumsum(pairs + 1)  # range i's offsets end here in `offsets`
            first, last = offsets[ends - pairs - 1], offsets[ends - 1]
            inner = np.ones(len(offsets), dtype=bool)
            inner[ends - pairs - 1] = False  # a range's first offset starts its lengths, it ends no length
            lengths = (offsets - np.concatenate([[0], offsets[:-1]]))[inner]
            claimed = last - first
            wrong = claimed > MAX_PIECES + MEAN_PIECES * pairs
            if (long := lengths > MAX_PIECES).any():  # the range that holds the first over-long sentence
                wrong[np.searchsorted(np.cumsum(pairs), np.argmax(long), side="right")] = True
            if wrong.any():
                i = int(np.argmax(wrong))
                raise InputError(
                    f"{self.path}: damaged training shard (pairs {starts[i]}-{stops[i]} claim {claimed[i]:,} pieces; "
                    "no text is that long)"
                )
            if (lengths < 0).any() or (len(pairs) and (first.min() < 0 or last.max() > self.ids[side].shape[0])):
                raise self._out_of_range(starts)  # before the ids are read: spans that run backwards or past the end
            ids = self._read_spans(self.ids[side], first, last).astype(np.int64)
            if len(ids) and not 0 <= ids.min() <= ids.max() < self.pieces:
                raise self._out_of_range(starts)
            sides.append((ids, lengths))
        return sides[0], sides[1]

    def _out_of_range(self, starts: np.ndarray) -> InputError:
        return InputError(f"{self.path}: damaged training shard (ids or lengths out of range, {len(starts)} ranges "
                          f"from pair {int(starts.min())})")  # fmt: skip

    def _read_spans(self, dataset: h5py.Dataset, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """dataset[starts[i]:stops[i]] for every i, concatenated in that order (the spans may overlap and come in
        any order): their union read in ascending runs, a gap of at most SPAN_GAP bytes read through rather than
        paying h5py's call for another read (at most that much more memory a span, for the read's moment)."""
        if not len(starts):
            return np.zeros(0, dtype=dataset.dtype)
        order = np.argsort(starts, kind="stable")
        lo, hi = starts[order], stops[order]
        reach = np.maximum.accumulate(hi)
        new = np.ones(len(lo), dtype=bool)
        gap = SPAN_GAP // dataset.dtype.itemsize  # a span this far past every earlier one's end starts a new run
        new[1:] = lo[1:] > reach[:-1] + gap
        run = np.cumsum(new) - 1
        run_lo, run_hi = lo[new], reach[np.append(np.flatnonzero(new)[1:] - 1, len(lo) - 1)]
        buf = np.concatenate([self._read(dataset, slice(a, b)) for a, b in zip(run_lo.tolist(), run_hi.tolist(),
                                                                                 strict=True)])  # fmt: skip
        sizes = run_hi - run_lo
        at = np.empty(len(lo), dtype=np.int64)
        at[order] = (np.cumsum(sizes) - sizes)[run] + lo - run_lo[run]  # where each span starts in buf
        return buf[span_positions(at, stops - starts)]

    def close(self) -> None:
        self.file.close()
