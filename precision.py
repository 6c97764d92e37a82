"""Rows at sentence-transformers' precisions: float32 or float16, each row's signs packed 8 a byte (binary), or
one byte a value cut from each column's range (int8), byte for byte as sentence-transformers gives them. encode's
`precision` and the embed command's `--dtype` (local and on Ray) store their rows through here."""

from __future__ import annotations

import warnings

import numpy as np

from paraphrastic.fileio import InputError

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")  # encode's `precision`, by sentence-transformers' names
BLOCK_ROWS = 65_536  # rows quantized at a time: the temporaries stay a few MB whatever the output


def signs(rows: np.ndarray, precision: str = "ubinary") -> np.ndarray:
    """Each row's signs (> 0), 8 a byte, as sentence-transformers packs them: `ubinary` as uint8, `binary` as int8
    (the same bytes minus 128): 1/32 of float32's bytes, and two rows' share of agreeing bits tracks their cosine."""
    out = np.empty((len(rows), -(-rows.shape[1] // 8)), dtype=np.uint8 if precision == "ubinary" else np.int8)
    packed = out.view(np.uint8)
    for at in range(0, len(rows), BLOCK_ROWS):
        packed[at : at + BLOCK_ROWS] = np.packbits(rows[at : at + BLOCK_ROWS] > 0, axis=1)
    if precision == "binary":
        np.bitwise_xor(packed, 0x80, out=packed)
    return out


def scaled_bytes(rows: np.ndarray, precision: str = "uint8") -> np.ndarray:
    """Rows as one byte a value, as sentence-transformers quantizes them: each column's range over these rows cut
    into 255 steps, a value as the step it falls in (`uint8`; a constant column: step 0), minus 128 for `int8`.
    The steps come from the rows given, so give them together: 100 or more."""
    if len(rows) == 1:
        raise ValueError(f"{precision} cuts each column's range over the rows: encode many texts together, not one")
    if 1 < len(rows) < 100:
        warnings.warn(f"{precision} steps from {len(rows)} rows: a column's range is that of these rows alone",
                      stacklevel=3)  # fmt: skip
    out = np.empty(rows.shape, dtype=np.uint8 if precision == "uint8" else np.int8)
    packed = out.view(np.uint8)
    if len(rows):
        low = rows.min(axis=0)
        step = (rows.max(axis=0) - low) / 255
        step[step == 0] = 1
        for at in range(0, len(rows), BLOCK_ROWS):
            packed[at : at + BLOCK_ROWS] = np.clip(np.floor((rows[at : at + BLOCK_ROWS] - low) / step), 0, 255)
    if precision == "int8":
        np.bitwise_xor(packed, 0x80, out=packed)
    return out


def row_layout(dim: int, dtype: str) -> tuple[int, str]:
    """The width and numpy type of a row of `dim` values stored as `dtype` (`rows_in`): float32, float16, or its
    signs packed 8 a byte (binary as int8, ubinary as uint8)."""
    row = rows_in(np.empty((0, dim), dtype=np.float32), dtype)
    return row.shape[1], row.dtype.name


def rows_in(rows: np.ndarray, dtype: str) -> np.ndarray:
    """Float rows stored as `dtype` (see row_layout)."""
    return signs(rows, dtype) if dtype.endswith("binary") else rows.astype(dtype, copy=False)


def check_truncate_dim(dim: int, truncate_dim: int | None) -> None:
    """--truncate-dim K of a command, against the `dim` values of its model's rows: one error line past them."""
    if truncate_dim is not None and truncate_dim > dim:
        raise InputError(f"--truncate-dim {truncate_dim} is more than the model's {dim} values a row")


def rows_as(rows: np.ndarray, normalize: bool, precision: str, dims: int | None = None) -> np.ndarray:
    """Rows as encode and the embed command are asked for them, where each row alone decides, in
    sentence-transformers' order: cut to their first `dims` values, scaled to unit length in place, then stored as
    `precision` (`rows_in`; int8 and uint8 stay float here, as their steps need every row: `scaled_bytes`)."""
    if dims is not None and dims < rows.shape[1]:
        rows = rows[:, :dims].copy()
    if normalize:
        rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows if precision.endswith("int8") else rows_in(rows, precision)
