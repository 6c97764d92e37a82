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

from fileio import InputError, atomic_path

SHARD_FORMAT = "paraphrastic-shard"
SHARD_VERSION = 1


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
        except (OSError, KeyError) as e:
            raise InputError(f"{self.path}: not a readable training shard ({e})") from None
        if attrs.get("format") != SHARD_FORMAT:
            raise InputError(f"{self.path}: not a training shard (no '{SHARD_FORMAT}' format attribute)")
        self.sp_sha256 = str(attrs["sp_sha256"])
        self.lowercase = bool(attrs["lowercase"])
        self.num_pairs = int(attrs["num_pairs"])
        if sp_model is not None and self.sp_sha256 != sp_checksum(sp_model):
            raise InputError(
                f"{self.path}: made with another sentencepiece model (checksum {self.sp_sha256[:12]}, "
                f"expected {sp_checksum(sp_model)[:12]}); re-encode it or pass the matching --sp-model"
            )

    def __len__(self) -> int:
        return self.num_pairs

    def read(self, start: int, stop: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Pairs [start, stop) as ((src flat ids, src lengths), (tgt flat ids, tgt lengths))."""
        sides = []
        for side in ("src", "tgt"):
            offsets = self.offsets[side][start : stop + 1]
            ids = self.ids[side][offsets[0] : offsets[-1]].astype(np.int64)
            sides.append((ids, np.diff(offsets)))
        return sides[0], sides[1]

    def close(self) -> None:
        self.file.close()
