"""The paper's SP sentence encoder: text -> sentencepiece pieces -> mean of their embeddings -> cosine.

SP (Wieting et al., "Paraphrastic Representations at Scale") averages the embeddings of a sentence's
sentencepiece pieces. This module holds the torch model classes (trained by train.py, run on a GPU), the
self-contained checkpoint format and `load_model`. The tokenizer and the `encode` / `score_raw_text` API are
static.py's, shared with its torch-free SPEncoder. The seed papers' other encoders (WORD, TRIGRAM, LSTM,
BLSTM, GRAN and their combinations) are parts of the same `Model`; their tokenizers and poolings are in
encoders.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from paraphrastic.checkpoint import (
    FORMAT,
    FORMAT_VERSION,
    INT8_VERSION,
    check_small,
    checked_finite,
    checked_rows,
    checkpoint_fields,
    inflation_refusal,
    scan_model_file,
    sp_tokenizer,
)
from paraphrastic.encoders import (
    COMBINE,
    POOLINGS,
    TOKENIZERS,
    combined,
    deinterleave,
    interleave,
    recurrent_layer,
    recurrent_pool,
)
from paraphrastic.fileio import NOT_REGULAR, ModelError, atomic_output, first_sentence, install_hint
from paraphrastic.options import STORED_PRECISIONS
from paraphrastic.pieces import Tokenizer, fill_empty, offsets_of
from paraphrastic.static import CHECKED, SP_FILE, Encoding, existing_model, sp_rows

TRAIN_STATE = "paraphrastic-train-state"  # the format of train.py's resume.pt
LEGACY_UNK = "UUUNKKK"  # the unknown-token row of the original toolkit's released models
MAX_SP_BYTES = 256 << 20  # sentencepiece models of even a million pieces are a few tens of MB
WEIGHT_KEYS = ("embeddings", "embedding.weight")  # model2vec's key, sentence-transformers' key
WEIGHT_DIRS = (".", "0_StaticEmbedding")  # where the two libraries put model.safetensors and tokenizer.json


class Bags(NamedTuple):
    """A batch of variable-length bags of table rows, the one layout every batch takes: bag i is
    ids[offsets[i] : offsets[i + 1]] (the last runs to the end). It unpacks as the (ids, offsets) the model takes."""

    ids: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def of(cls, flat: np.ndarray, lengths: np.ndarray) -> Bags:
        """The bags of (flat ids, per-bag lengths), the layout tokenizers and shards hand out."""
        return cls(torch.from_numpy(flat), torch.from_numpy(offsets_of(lengths)))

    def lengths(self) -> torch.Tensor:
        return torch.diff(self.offsets, append=self.offsets.new_tensor([len(self.ids)]))

    def to(self, device: torch.device) -> Bags:
        return Bags(self.ids.to(device), self.offsets.to(device))

    def slice(self, start: int, stop: int) -> Bags:
        """Bags [start, stop)."""
        offsets = self.offsets[start:stop]
        end = self.offsets[stop] if stop < len(self.offsets) else len(self.ids)
        return Bags(self.ids[offsets[0] : end], offsets - offsets[0])

    def take(self, idx: torch.Tensor, lengths: torch.Tensor | None = None, total: int | None = None) -> Bags:
        """Bags `idx`, in that order, without a Python loop (`lengths`: this batch's, when already at hand;
        `total`: their ids' count, when the host knows it, so that a GPU need not report it back)."""
        lens = (self.lengths() if lengths is None else lengths)[idx]
        offsets = torch.cumsum(lens, 0) - lens
        shift = torch.repeat_interleave(offsets - self.offsets[idx], lens, output_size=total)
        return Bags(self.ids[torch.arange(len(shift), device=self.ids.device) - shift], offsets)

    def cat(self, other: Bags) -> Bags:
        """These bags, then `other`'s."""
        return Bags(torch.cat([self.ids, other.ids]), torch.cat([self.offsets, other.offsets + len(self.ids)]))


def mean_pool(table: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """Mean of the rows of each bag; with `dropout` > 0 (training) each gathered row is dropped out first."""
    if dropout == 0.0:
        return F.embedding_bag(ids, table, offsets, mode="mean")
    rows = F.dropout(table.index_select(0, ids), p=dropout, training=True)
    return F.embedding_bag(torch.arange(len(ids), device=ids.device), rows, offsets, mode="mean")


class Model(nn.Module, Encoding):
    """A sentence encoder: each part tokenizes the text and pools its rows of one shared embedding table
    (mean, or a recurrent pooling from encoders.py); the parts' vectors are added or concatenated.

    Part k owns rows [starts[k], starts[k] + len(tokenizers[k])) of the table, so one row-sparse optimizer
    serves every part. A text's ids are its parts' ids one after the other (see `encoders.interleave`); a part
    with no token for a text (an empty text) uses its unknown id.
    """

    def __init__(
        self,
        tokenizers: list,
        poolings: list[str],
        embedding: torch.Tensor,
        config: dict | None = None,
        combine: str = "add",
        check_rows: bool = True,
    ):
        """`check_rows=False`: a piece-to-row map (SPModel of the original release) decides the rows."""
        super().__init__()
        if len(tokenizers) != len(poolings) or not tokenizers:
            raise ModelError("a model needs one pooling per tokenizer, and at least one part")
        if combine not in COMBINE or any(p not in POOLINGS for p in poolings):
            raise ModelError(f"unknown pooling or combination: {poolings}, {combine!r}")
        sizes = [len(t) for t in tokenizers]
        if check_rows and embedding.shape[0] != sum(sizes):
            what = "the sentencepiece model has" if len(sizes) == 1 and tokenizers[0].kind == "sp" else "the parts have"
            raise ModelError(f"embedding has {embedding.shape[0]} rows but {what} {sum(sizes)} pieces; they must match")
        self.tokenizers, self.poolings, self.combine = list(tokenizers), list(poolings), combine
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.embedding = nn.Embedding.from_pretrained(embedding.float(), freeze=False)
        width = embedding.shape[1]
        # the recurrent parts' weights, by part
        self.lstms = nn.ModuleDict({str(k): recurrent_layer(p, width) for k, p in enumerate(poolings) if p != "mean"})
        self.config = {"encoder": self.kind, "lowercase": tokenizers[0].lowercase, **(config or {})}
        self.config.update(dim=self.dim, vocab_size=embedding.shape[0])
        if len(tokenizers) > 1 or poolings != ["mean"] or tokenizers[0].kind != "sp":
            self.config.update(parts=[{"pool": p, "tokens": t.kind} for p, t in self.parts()], combine=combine)

    def parts(self) -> list[tuple[str, object]]:
        return list(zip(self.poolings, self.tokenizers, strict=True))

    @property
    def pooled_by_mean(self) -> bool:
        return not self.lstms  # a recurrent part's batch is its memory: the one asked for is kept

    @property
    def kind(self) -> str:
        """'sp', 'word', 'trigram', 'lstm', 'blstm', 'gran' (over sentencepiece), 'lstm-word', ... joined by '+'."""
        names = [t.kind if p == "mean" else p + ("" if t.kind == "sp" else f"-{t.kind}") for p, t in self.parts()]
        return "+".join(names)

    @property
    def dim(self) -> int:
        width = self.embedding.embedding_dim
        return width * len(self.tokenizers) if self.combine == "concat" else width

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    @property
    def on_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def sp_tokenizer(self) -> Tokenizer | None:
        """The sentencepiece tokenizer when the model's ids are exactly sentencepiece ids (HDF5 shards hold those)."""
        only = self.tokenizers[0]
        return only if len(self.tokenizers) == 1 and only.kind == "sp" else None

    def __repr__(self) -> str:
        return (
            f"Model(encoder={self.kind}, combine={self.combine}, rows={self.embedding.num_embeddings}, "
            f"dim={self.dim}, lowercase={self.tokenizers[0].lowercase}, device={self.device})"
        )

    def token_ids(self, texts: Sequence[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(flat table rows, per-text lengths): every part's ids, shifted to its rows, empty parts filled."""
        parts = []
        for start, tokenizer in zip(self.starts, self.tokenizers, strict=False):
            flat, lengths = fill_empty(*tokenizer.encode_flat(texts, num_threads), tokenizer.unk_id)
            parts.append((flat + start, lengths))
        return parts[0] if len(parts) == 1 else interleave(parts)

    def rows_and_offsets(self, flat: np.ndarray, lengths: np.ndarray) -> Bags:
        """The bags of `token_ids`' output."""
        return Bags.of(flat, lengths)

    def split_parts(self, ids: torch.Tensor, offsets: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each part's (rows, offsets) out of the joint bags, in order within each bag."""
        return [(ids, offsets)] if len(self.tokenizers) == 1 else deinterleave(ids, offsets, self.starts)

    def pool_parts(
        self, table: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]], dropout: float = 0.0
    ) -> torch.Tensor:
        """The sentence vectors from each part's (rows of `table`, offsets), added or concatenated."""
        vectors = [
            mean_pool(table, ids, offsets, dropout)
            if pooling == "mean"
            else recurrent_pool(self.lstms[str(k)], table, ids, offsets, dropout)
            for k, (pooling, (ids, offsets)) in enumerate(zip(self.poolings, parts, strict=True))
        ]
        return vectors[0] if len(vectors) == 1 else combined(vectors, self.combine)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        """Sentence vectors (len(offsets), dim) of bags of table rows."""
        ids, offsets = ids.to(self.device), offsets.to(self.device)
        return self.pool_parts(self.embedding.weight, self.split_parts(ids, offsets), dropout)

    @torch.no_grad()
    def embed_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The vectors of texts already tokenized by `token_ids` (a GPU pools what CPU workers tokenized)."""
        return self(*self.rows_and_offsets(flat, lengths)).cpu().numpy()

    def checkpoint(self, extra_config: dict | None = None, precision: str = "float32") -> dict:
        """The self-contained checkpoint: table, tokenizers, LSTM weights and config, as plain data. The table is
        stored in `precision` (STORED_PRECISIONS); it is computed in float32 whatever it is stored in."""
        if precision not in STORED_PRECISIONS:
            raise ModelError(f"precision {precision!r}: choose one of {', '.join(STORED_PRECISIONS)}")
        table = self.embedding.weight.detach().cpu()
        state = {
            "format": FORMAT,
            "format_version": INT8_VERSION if precision == "int8" else FORMAT_VERSION,
            "config": _plain({**self.config, **(extra_config or {})}),
        }
        if precision == "int8":
            state["embedding"], state["embedding_scale"] = quantize_rows(table)
        else:
            state["embedding"] = table.half() if precision == "float16" else table.clone()
        sp = [t for t in self.tokenizers if t.kind == "sp"]
        if sp:
            state["sp_model"] = sp[0].sp_model
            if (index := sp[0].index) is not None:  # so that a small job's tokenizer is cut to its pieces
                state["piece_index"] = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                        for k, v in index.items()}  # fmt: skip
        if "parts" in self.config:
            state["vocabs"] = [getattr(t, "vocab", None) for t in self.tokenizers]
            state["lstm"] = {k: v.detach().cpu().clone() for k, v in self.lstms.state_dict().items()}
        return state

    def save(self, path: str | os.PathLike, extra_config: dict | None = None, precision: str = "float32") -> None:
        """Write the checkpoint atomically."""
        with atomic_output(path) as f:
            torch.save(self.checkpoint(extra_config, precision), f)


class SPModel(Model):
    """The paper's SP: sentence embedding = mean of the rows of `embedding` picked by the text's
    sentencepiece ids.

    `piece_rows` maps a sentencepiece id to its row (-1: no row, the piece is dropped); it is None
    for native models, whose rows are exactly the sentencepiece vocabulary. A text with no known
    piece (empty, or all dropped) gets the unknown-token row.
    """

    piece_ids = True

    def __init__(
        self,
        tokenizer: Tokenizer,
        embedding: torch.Tensor,
        config: dict | None = None,
        piece_rows: np.ndarray | None = None,
        unk_row: int | None = None,
    ):
        super().__init__([tokenizer], ["mean"], embedding, config, check_rows=piece_rows is None)
        self.piece_rows = piece_rows
        self.unk_row = tokenizer.unk_id if unk_row is None else unk_row

    @property
    def tokenizer(self) -> Tokenizer:
        return self.tokenizers[0]

    def __repr__(self) -> str:
        kind = "legacy " if self.piece_rows is not None else ""
        return (
            f"SPModel({kind}rows={self.embedding.num_embeddings}, dim={self.dim}, "
            f"lowercase={self.tokenizer.lowercase}, pieces={len(self.tokenizer)}, device={self.device})"
        )

    def token_ids(self, texts: Sequence[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Raw sentencepiece ids (what HDF5 shards hold); `rows_and_offsets` maps them to rows."""
        return self.tokenizer.encode_flat(texts, num_threads)

    def rows_and_offsets(self, flat: np.ndarray, lengths: np.ndarray) -> Bags:
        """Map piece ids to rows (dropping pieces without a row); empty texts get the unknown row."""
        return Bags.of(*sp_rows(flat, lengths, self.piece_rows, self.unk_row))

    def checkpoint(self, extra_config: dict | None = None, precision: str = "float32") -> dict:
        state = super().checkpoint(extra_config, precision)
        if self.piece_rows is not None:
            state["piece_rows"] = torch.from_numpy(self.piece_rows)
            state["unk_row"] = self.unk_row
        return state


def _plain(value):
    """Config values as plain JSON-like types, so the checkpoint loads with weights_only=True."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """CPU unless asked; 'auto' picks CUDA when available; asking for missing CUDA is an error."""
    if device in (None, "cpu"):
        return torch.device("cpu")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):  # torch's message lists every device type it knows, ours the ones we run on
        raise ModelError(f"device {device!r} is none of cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda was asked for but no CUDA device is available (use cpu or auto)")
    return device


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether bfloat16 matrix products run natively here (CUDA, or a CPU with AVX512-BF16 or AMX);
    elsewhere torch emulates them several times slower than float32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _safe_load(path: Path) -> dict:
    """torch.load that never runs pickled code: only tensors, plain types and argparse.Namespace."""
    _check_inflation(path)
    scan_model_file(path)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if _unpickler_line(e, "GLOBAL") is None:  # not an object it refused: bytes that are no pickle at all
            reason = _unpickler_line(e, "Unsupported") or "not a pickle"
            raise ModelError(f"{path}: not a readable model file, truncated or corrupt ({reason})") from None
        raise ModelError(
            f"{path}: refused to load: it holds code or objects other than tensors and plain data "
            f"({_unpickler_line(e, 'GLOBAL')}); this toolkit never runs pickled code from a model file"
        ) from None
    except FileNotFoundError:
        raise
    except Exception as e:  # any other failure to unpickle is a damaged file, whatever the library raised
        with path.open("rb") as f:  # torch writes a zip archive; its older files and the original release, a pickle
            head = f.read(2)
        reason = first_sentence(e) if head == b"PK" or head[:1] == b"\x80" else "neither a zip archive nor a pickle"
        raise ModelError(f"{path}: not a readable model file, truncated or corrupt ({reason})") from None
    if not isinstance(state, dict):
        raise ModelError(f"{path}: not a model checkpoint (top level is {type(state).__name__})")
    for key in ("config", "args"):
        check_small(state.get(key), path, key)
    check_layouts(state, path)
    return state


def check_layouts(value, path: Path, name: str = "", depth: int = 0) -> None:
    """Refuse a tensor not laid out as torch.save writes ours: contiguous and within its storage. A view declares
    any shape over little memory (80,000 x 12,000 over one float, in 2 MB), and becomes that size when used."""
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage().nbytes() // max(value.element_size(), 1)
        if not value.is_contiguous() or value.storage_offset() + value.numel() > storage:
            raise ModelError(f"{path}: tensor {name or '?'} of shape {tuple(value.shape)} is a view over {storage:,} "
                             "values, not laid out as a model file's; refused (the file is corrupt or hostile)")  # fmt: skip
    elif depth < 8 and isinstance(value, dict | list | tuple):
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            check_layouts(item, path, f"{name}.{key}" if name else str(key), depth + 1)


def _check_inflation(path: Path) -> None:
    """Refuse a zip (torch's format) whose members inflate beyond the file (a zip bomb), each or all together:
    torch stores tensors uncompressed, so a model's members hold no more than its own bytes (64 MiB allowed over)."""
    try:
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
    except Exception:  # noqa: BLE001 - any damaged zip directory: torch.load refuses the file with its own error
        return
    if why := inflation_refusal(members, path.stat().st_size):
        raise ModelError(f"{path}: {why}; not a model file this toolkit wrote")


def _unpickler_line(error: Exception, word: str) -> str | None:
    """The line of torch's weights-only refusal that holds `word` (GLOBAL: what the file tried to load)."""
    lines = [line.strip() for line in str(error).splitlines() if word.lower() in line.lower()]
    return lines[0].rstrip(".") if lines else None


MAX_JSON_BYTES = 64 << 20  # a tokenizer.json of a million pieces is a few tens of MB


def read_json_object(path: Path, what: str) -> dict:
    """A model folder's JSON file as a dict, or a ModelError naming it: unreadable, too large, nested beyond any
    real file (json would recurse until Python gives up), or not an object at the top."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ModelError(f"{path}: {path.stat().st_size:,} bytes, larger than any {what}")
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, OSError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else first_sentence(e)
        raise ModelError(f"{path}: not a valid {what} ({reason})") from None
    if not isinstance(value, dict):
        raise ModelError(f"{path}: not a valid {what} (its top level is {type(value).__name__}, not an object)")
    check_small(value, path, what, budget=10_000_000)
    return value


def check_export(folder: Path) -> None:
    """Refuse a folder whose files do not all come from one export (one interrupted over another), by the
    checksums our config.json records; folders from other tools carry none and pass."""
    path = find_in_folder(folder, "config.json")
    ours = read_json_object(path, "config.json").get("paraphrastic") if path else None
    sums = ours.get("sha256") if isinstance(ours, dict) else None
    if not isinstance(sums, dict):
        return
    for name in CHECKED:
        found = find_in_folder(folder, name)
        if found is None or hashlib.sha256(found.read_bytes()).hexdigest() != sums.get(name):
            raise ModelError(
                f"{folder}: {name} is not the file its config.json was exported with (an interrupted export?); "
                "export the model again"
            )


def find_in_folder(folder: Path, name: str) -> Path | None:
    """`name` at the folder's root or in sentence-transformers' module subfolder."""
    return next((p for d in WEIGHT_DIRS if (p := folder / d / name).is_file()), None)


def is_static_folder(path: Path) -> bool:
    """Whether `path` is a folder in one of the static-embedding layouts."""
    return path.is_dir() and find_in_folder(path, "model.safetensors") is not None


def read_folder_table(folder: Path) -> torch.Tensor:
    """The per-token table, with model2vec's vocabulary quantization (mapping, weights) folded in."""
    try:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
    except ImportError:
        raise ModelError(f"{folder}: reading a static-embedding folder needs {install_hint('interop')}") from None
    path = find_in_folder(folder, "model.safetensors")
    check_fits_memory(path, path.stat().st_size)
    try:
        tensors = load_file(path)
    except SafetensorError as e:
        raise ModelError(f"{path}: not a readable safetensors file, truncated or corrupt ({e})") from None
    except MemoryError:
        raise ModelError(f"{path}: too large to load in this machine's memory") from None
    key = next((k for k in WEIGHT_KEYS if k in tensors), None)
    if key is None:
        raise ModelError(f"{folder}: model.safetensors has no {' or '.join(WEIGHT_KEYS)} tensor")
    table = tensors[key]
    if table.ndim != 2 or table.dtype.kind != "f" or 0 in table.shape:
        raise ModelError(f"{path}: {key} is {table.dtype} of shape {table.shape}, expected a 2-D float table")
    table = table.astype(np.float32)
    if "mapping" in tensors:
        mapping = tensors["mapping"]
        if mapping.ndim != 1 or mapping.dtype.kind not in "iu" or ((mapping < 0) | (mapping >= len(table))).any():
            raise ModelError(f"{path}: its mapping is not a list of rows of the {len(table)}-row table")
        table = table[mapping.astype(np.int64)]
    if "weights" in tensors:
        weights = tensors["weights"]
        if weights.shape != (len(table),) or weights.dtype.kind != "f":
            raise ModelError(f"{path}: its weights are {weights.shape}, expected one float per row ({len(table)})")
        table = table * weights.astype(np.float32)[:, None]
    return checked_table(torch.from_numpy(np.ascontiguousarray(table)), path)


def check_fits_memory(path: Path, size: int) -> None:
    """Refuse a file whose contents need more memory to load (about three copies on the way to a float32 table)
    than the machine has available, before reading any of it."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        available = 1024 * int(
            next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable"))
        )
    except (OSError, StopIteration, ValueError):
        return
    if 3 * size > available:
        raise ModelError(
            f"{path}: {size / 2**30:,.1f} GiB, more than this machine's free memory ({available / 2**30:,.1f} GiB) "
            "can load; is it a model file?"
        )


def _tokenizer_json(folder: Path) -> tuple[dict, Path]:
    path = find_in_folder(folder, "tokenizer.json")
    if path is None:
        raise ModelError(f"{folder}: no tokenizer.json")
    return read_json_object(path, "tokenizer.json"), path


def _lowercases(spec, path: Path) -> bool:
    """Whether a tokenizer.json normalizer (possibly a Sequence) lowercases; a malformed one is a ModelError."""
    if spec is None:
        return False
    parts = spec.get("normalizers", []) if isinstance(spec, dict) else None
    if not isinstance(parts, list):
        raise ModelError(f"{path}: not a valid tokenizer.json (its normalizer is not an object with a list)")
    return spec.get("type") == "Lowercase" or any(_lowercases(part, path) for part in parts)


def import_folder(folder: str | os.PathLike) -> SPModel:
    """A static-embedding folder as an SPModel: its table, and the sentencepiece model it ships.

    Only sentencepiece-based folders are supported (ours, or any whose rows are sentencepiece ids):
    a WordPiece or BPE tokenizer.json cannot drive this toolkit's sentencepiece tokenizer.
    """
    folder = Path(folder)
    if not is_static_folder(folder):
        if trained := [name for name in ("model.pt", "best.pt") if (folder / name).is_file()]:
            raise ModelError(f"{folder}: a training folder, not a model: load {folder / trained[0]}"
                             + (f" (or {folder / trained[1]}, the best on the dev sets)" if len(trained) > 1 else ""))  # fmt: skip
        raise ModelError(f"{folder}: a folder, but not a static-embedding model (no model.safetensors)")
    check_export(folder)
    spec, spec_path = _tokenizer_json(folder)
    sp_path = find_in_folder(folder, SP_FILE)
    if sp_path is None:
        model = spec.get("model")
        kind = model.get("type", "unknown") if isinstance(model, dict) else "unknown"
        hint = (
            f"; if sentence-transformers re-saved an exported model, copy {SP_FILE} into it"
            if kind == "Unigram"
            else ""
        )
        raise ModelError(
            f"{folder}: no {SP_FILE}: only static models built on a sentencepiece model can be imported, "
            f"and this tokenizer.json is {kind}{hint}"
        )
    tokenizer = Tokenizer(read_sp_model(sp_path), _lowercases(spec.get("normalizer"), spec_path), source=sp_path)
    return SPModel(tokenizer, read_folder_table(folder), {"source": folder.name})


def load_model(
    path: str | os.PathLike | None = None,
    sp_model: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
) -> Model:
    """Load a model file: our self-contained checkpoint, the original toolkit's release layout (then
    `sp_model` names its sentencepiece model), or a sentence-transformers / model2vec static-embedding
    folder with a sentencepiece model (import_folder; interop.py writes them). No path loads the shipped English model; the
    name "multilingual" (or "default"), when no such file exists, loads that shipped model."""
    path = existing_model(path)
    if path.is_dir():
        return import_folder(path).to(resolve_device(device)).eval()
    state = _safe_load(path)
    try:
        kind = state.get("format") if isinstance(state.get("format"), str) else None
        if kind == FORMAT:
            model = from_checkpoint(state, path)
        elif "state_dict" in state and "vocab" in state:
            model = _from_legacy(state, path, sp_model)
        elif kind == TRAIN_STATE:
            raise ModelError(f"{path}: a training state for --resume, not a model: load model.pt or best.pt beside it")
        else:
            raise ModelError(f"{path}: not a paraphrastic model (keys: {sorted(map(str, state))[:6]})")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as e:
        raise ModelError(f"{path}: malformed model file ({type(e).__name__}: {first_sentence(e)})") from None
    return model.to(resolve_device(device)).eval()


def from_checkpoint(state: dict, path: str | os.PathLike) -> Model:
    """A model from the contents of one of our checkpoint files (`Model.checkpoint()`), checked by the format's one
    description, checkpoint.checkpoint_fields."""
    fields = checkpoint_fields(state, path)
    table = fields["embedding"]
    if fields["format_version"] == INT8_VERSION:
        table = table.float().mul_(fields["embedding_scale"].float())  # in place, as static_from_checkpoint
    table = checked_finite(table, path)
    if "tokenizer" not in fields:
        return _general_from_native(state, fields["config"], table, path)
    return SPModel(fields["tokenizer"], table, fields["config"], fields["piece_rows"], fields["unk_row"])


def _general_from_native(state: dict, config: dict, table: torch.Tensor, path: Path) -> Model:
    """A word, trigram, LSTM or combined model: its parts, vocabularies and LSTM weights."""
    parts, vocabs = config.get("parts"), state.get("vocabs")
    if not isinstance(parts, list) or not isinstance(vocabs, list) or len(parts) != len(vocabs):
        raise ModelError(f"{path}: encoder {config['encoder']!r} but no valid parts in the model file (it is corrupt)")
    tokenizers = []
    for part, vocab in zip(parts, vocabs, strict=True):
        kind = part.get("tokens")
        if kind == "sp":
            tokenizers.append(sp_tokenizer(state, path))
        elif kind in TOKENIZERS and isinstance(vocab, list) and all(isinstance(v, str) for v in vocab):
            tokenizers.append(TOKENIZERS[kind](vocab, config["lowercase"]))
        else:
            raise ModelError(f"{path}: part {part} is not supported by this version (or the file is corrupt)")
    model = Model(tokenizers, [p.get("pool") for p in parts], table, config, config.get("combine", "add"))
    try:
        model.lstms.load_state_dict(state.get("lstm") or {})
    except RuntimeError as e:
        raise ModelError(f"{path}: the LSTM weights do not fit the model ({first_sentence(e)})") from None
    return model


def quantize_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row as int8 values times its own bfloat16 scale (about its largest |value| / 127): a quarter of the
    bytes of float32, and every value within half a step of the original."""
    scale = (table.abs().amax(1, keepdim=True) / 127).bfloat16().clamp_min(torch.finfo(torch.bfloat16).tiny)
    return torch.round(table / scale.float()).clamp(-127, 127).to(torch.int8), scale


def checked_table(table, path: Path) -> torch.Tensor:
    """The embedding table, which must be a 2-D float tensor of finite values."""
    if not isinstance(table, torch.Tensor) or table.ndim != 2 or not table.is_floating_point() or 0 in table.shape:
        raise ModelError(f"{path}: no usable embedding table (expected a 2-D float tensor; the file is corrupt)")
    return checked_finite(table, path)


def _from_legacy(state: dict, path: Path, sp_model: str | os.PathLike | None) -> SPModel:
    """The original release: state_dict['embedding.weight'], vocab piece -> row, args namespace."""
    if sp_model is None:
        raise ModelError(f"{path}: an original-toolkit model needs its sentencepiece model: pass sp_model=")
    sp_bytes = read_sp_model(sp_model)
    args = state.get("args")
    args = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    vocab = state["vocab"]
    if not isinstance(vocab, dict) or LEGACY_UNK not in vocab:
        raise ModelError(f"{path}: vocabulary has no {LEGACY_UNK} row")
    weight = checked_table(state["state_dict"]["embedding.weight"], path)
    tokenizer = Tokenizer(sp_bytes, bool(args.get("lower_case", True)), source=sp_model)
    pieces = [tokenizer.sp.id_to_piece(i) for i in range(len(tokenizer))]
    piece_rows = checked_rows(torch.tensor([vocab.get(p, -1) for p in pieces]), len(pieces), len(weight), path)
    config = {"legacy_args": _plain(args), "source": "original-release"}
    return SPModel(tokenizer, weight, config, piece_rows=piece_rows, unk_row=int(vocab[LEGACY_UNK]))


def read_sp_model(path: str | os.PathLike) -> bytes:
    """A sentencepiece model file's bytes, checked to load; a ModelError naming the file otherwise."""
    try:
        size, regular = os.stat(path).st_size, Path(path).is_file()
        if not regular or size > MAX_SP_BYTES:
            what = f"{size:,} bytes, more than any sentencepiece model" if regular else NOT_REGULAR
            raise ModelError(f"{path}: {what}")
        data = Path(path).read_bytes()
    except OSError as e:
        raise ModelError(f"{path}: cannot read the sentencepiece model ({(e.strerror or str(e)).lower()})") from None
    Tokenizer(data, lowercase=False, source=path)
    return data
