"""The SP encoder: text -> sentencepiece ids -> mean of piece embeddings -> cosine.

A sentence vector is the average of the embeddings of its sentencepiece pieces (Wieting et al.,
"Paraphrastic Representations at Scale"). This module holds the model, its tokenizer, the
self-contained checkpoint format, and the `embed_raw_text` / `score_raw_text` API.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from torch import nn

from fileio import atomic_output

FORMAT = "paraphrastic-sp"
FORMAT_VERSION = 1
LEGACY_UNK = "UUUNKKK"  # the unknown-token row of the original toolkit's released models
DEFAULT_MODEL = Path(__file__).resolve().parent / "data" / "models" / "default.pt"


class ModelError(Exception):
    """A model file that cannot be used: missing, corrupt, foreign or unsafe."""


class Tokenizer:
    """Sentencepiece plus the model's lowercasing; turns a batch of texts into flat ids + offsets."""

    def __init__(self, sp_model: bytes, lowercase: bool, source: str | os.PathLike | None = None):
        self.sp_model = sp_model
        self.lowercase = lowercase
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(sp_model)
        except (RuntimeError, OSError, TypeError) as e:
            where = f"{source}: " if source is not None else ""
            reason = _first_sentence(e).removeprefix("INTERNAL: ")
            reason = "it does not parse" if "ParseFromArray" in reason else reason
            raise ModelError(f"{where}not a valid sentencepiece model, truncated or corrupt ({reason})") from None

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Piece ids of each text (lowercased first when the model was trained lowercased)."""
        if self.lowercase:
            texts = list(map(str.lower, texts))
        return self.sp.encode(list(texts), num_threads=num_threads)


def flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-text id lists into (flat ids, per-text lengths), both int64."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """Start offset of each bag from its length."""
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    return offsets


class SPModel(nn.Module):
    """Sentence embedding = mean of the rows of `embedding` picked by the text's sentencepiece ids.

    `piece_rows` maps a sentencepiece id to its row (-1: no row, the piece is dropped); it is None
    for native models, whose rows are exactly the sentencepiece vocabulary. A text with no known
    piece (empty, or all dropped) gets the unknown-token row.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        embedding: torch.Tensor,
        config: dict | None = None,
        piece_rows: np.ndarray | None = None,
        unk_row: int | None = None,
    ):
        super().__init__()
        if piece_rows is None and embedding.shape[0] != len(tokenizer):
            raise ModelError(
                f"embedding has {embedding.shape[0]} rows but the sentencepiece model has "
                f"{len(tokenizer)} pieces; they must match"
            )
        self.tokenizer = tokenizer
        self.embedding = nn.Embedding.from_pretrained(embedding.float(), freeze=False)
        self.piece_rows = piece_rows
        self.unk_row = tokenizer.sp.unk_id() if unk_row is None else unk_row
        self.config = {"encoder": "sp", "lowercase": tokenizer.lowercase, **(config or {})}
        self.config.update(dim=self.dim, vocab_size=embedding.shape[0])

    @property
    def dim(self) -> int:
        return self.embedding.embedding_dim

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    def __repr__(self) -> str:
        kind = "legacy " if self.piece_rows is not None else ""
        return (
            f"SPModel({kind}rows={self.embedding.num_embeddings}, dim={self.dim}, "
            f"lowercase={self.tokenizer.lowercase}, pieces={len(self.tokenizer)}, device={self.device})"
        )

    def ids_and_offsets(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenize a batch into (row ids, bag offsets), applying the drop and unknown rules."""
        flat, lengths = flatten(self.tokenizer.encode(texts, num_threads=torch.get_num_threads()))
        return self.rows_and_offsets(flat, lengths)

    def rows_and_offsets(self, flat: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Map piece ids to rows (dropping unknown pieces); empty texts get the unknown row."""
        if self.piece_rows is not None:
            rows = self.piece_rows[flat]
            keep = rows >= 0
            owner = np.repeat(np.arange(len(lengths)), lengths)
            flat = rows[keep]
            lengths = np.bincount(owner[keep], minlength=len(lengths)).astype(np.int64)
        empty = np.flatnonzero(lengths == 0)
        if len(empty):
            flat = np.insert(flat, offsets_of(lengths)[empty], self.unk_row)
            lengths = lengths.copy()
            lengths[empty] = 1
        return torch.from_numpy(flat), torch.from_numpy(offsets_of(lengths))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        """Mean of the embedding rows of each bag: (len(offsets), dim).

        With `dropout` > 0 (training), each gathered row is dropped out before averaging.
        """
        ids, offsets = ids.to(self.device), offsets.to(self.device)
        if dropout == 0.0:
            return F.embedding_bag(ids, self.embedding.weight, offsets, mode="mean")
        rows = F.dropout(self.embedding(ids), p=dropout, training=True)
        lengths = torch.diff(offsets, append=offsets.new_tensor([len(ids)]))
        owner = torch.repeat_interleave(torch.arange(len(offsets), device=ids.device), lengths)
        total = torch.zeros(len(offsets), self.dim, device=ids.device, dtype=rows.dtype).index_add_(0, owner, rows)
        return total / lengths.unsqueeze(1).to(rows.dtype)

    @torch.no_grad()
    def embed_raw_text(self, texts: Sequence[str], batch_size: int = 8192) -> np.ndarray:
        """Embed raw sentences: a float32 array (len(texts), dim), one row per text, in order."""
        if isinstance(texts, str):
            raise TypeError("embed_raw_text takes a list of sentences, not a single string")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            out[start : start + len(batch)] = self(*self.ids_and_offsets(batch)).cpu().numpy()
        return out

    def score_raw_text(self, pairs: Sequence[tuple[str, str]], batch_size: int = 8192) -> list[float]:
        """Cosine similarity of each (sentence1, sentence2) pair, in order."""
        left = self.embed_raw_text([p[0] for p in pairs], batch_size)
        right = self.embed_raw_text([p[1] for p in pairs], batch_size)
        return cosine(left, right).tolist()

    def save(self, path: str | os.PathLike, extra_config: dict | None = None, half: bool = False) -> None:
        """Write the self-contained checkpoint (embeddings, sentencepiece model, config) atomically."""
        table = self.embedding.weight.detach().cpu()
        state = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "config": _plain({**self.config, **(extra_config or {})}),
            "embedding": table.half() if half else table.clone(),
            "sp_model": self.tokenizer.sp_model,
        }
        if self.piece_rows is not None:
            state["piece_rows"] = torch.from_numpy(self.piece_rows)
            state["unk_row"] = self.unk_row
        with atomic_output(path) as f:
            torch.save(state, f)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (N, dim) arrays; a zero vector scores 0."""
    num = np.einsum("ij,ij->i", a, b, dtype=np.float64)
    den = np.linalg.norm(a, axis=1).astype(np.float64) * np.linalg.norm(b, axis=1)
    return np.clip(np.divide(num, den, out=np.zeros_like(num), where=den > 0), -1.0, 1.0)


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
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda was asked for but no CUDA device is available (use cpu or auto)")
    return device


def _safe_load(path: Path) -> dict:
    """torch.load that never runs pickled code: only tensors, plain types and argparse.Namespace."""
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
        raise ModelError(f"{path}: not a readable model file, truncated or corrupt ({_first_sentence(e)})") from None
    if not isinstance(state, dict):
        raise ModelError(f"{path}: not a model checkpoint (top level is {type(state).__name__})")
    return state


def _first_sentence(error: Exception) -> str:
    text = str(error).strip().splitlines()[0].strip() if str(error).strip() else type(error).__name__
    return text.split(". ")[0].rstrip(".")


def _unpickler_line(error: Exception, word: str) -> str | None:
    """The line of torch's weights-only refusal that holds `word` (GLOBAL: what the file tried to load)."""
    lines = [line.strip() for line in str(error).splitlines() if word.lower() in line.lower()]
    return lines[0].rstrip(".") if lines else None


def load_model(
    path: str | os.PathLike | None = None,
    sp_model: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
) -> SPModel:
    """Load a model file: our self-contained checkpoint, the original toolkit's release layout (then
    `sp_model` names its sentencepiece model), or a sentence-transformers / model2vec static-embedding
    folder with a sentencepiece model (see interop.py). No path loads the shipped default model."""
    path = Path(path) if path is not None else DEFAULT_MODEL
    if not path.exists():
        hint = " (the default model is not installed; pass a model file)" if path == DEFAULT_MODEL else ""
        raise ModelError(f"{path}: no such model file{hint}")
    if path.is_dir():
        from interop import import_folder  # imported here: the core never needs the interop extra

        return import_folder(path).to(resolve_device(device)).eval()
    state = _safe_load(path)
    try:
        if state.get("format") == FORMAT:
            model = _from_native(state, path)
        elif "state_dict" in state and "vocab" in state:
            model = _from_legacy(state, path, sp_model)
        else:
            raise ModelError(f"{path}: not a paraphrastic model (keys: {sorted(map(str, state))[:6]})")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as e:
        raise ModelError(f"{path}: malformed model file ({type(e).__name__}: {_first_sentence(e)})") from None
    return model.to(resolve_device(device)).eval()


def _from_native(state: dict, path: Path) -> SPModel:
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelError(f"{path}: format version {version} is not supported (this toolkit reads {FORMAT_VERSION})")
    config = state.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("lowercase"), bool):
        raise ModelError(f"{path}: no valid config in the model file (it is corrupt)")
    if config.get("encoder", "sp") != "sp":
        raise ModelError(f"{path}: encoder kind {config['encoder']!r} is not supported by this version")
    table = _checked_table(state.get("embedding"), path)
    if not isinstance(state.get("sp_model"), bytes):
        raise ModelError(f"{path}: no sentencepiece model inside the model file (it is corrupt)")
    tokenizer = Tokenizer(state["sp_model"], config["lowercase"], source=path)
    rows, unk = state.get("piece_rows"), state.get("unk_row")
    if rows is None and len(table) != len(tokenizer):
        raise ModelError(f"{path}: {len(table)} embedding rows for {len(tokenizer)} pieces (the file is corrupt)")
    if rows is not None:
        rows = _checked_rows(rows, len(tokenizer), len(table), path)
        if not isinstance(unk, int) or not 0 <= unk < len(table):
            raise ModelError(f"{path}: unknown-token row {unk!r} is not a row of the table (the file is corrupt)")
    return SPModel(tokenizer, table, config, piece_rows=rows, unk_row=unk if rows is not None else None)


def _checked_table(table, path: Path) -> torch.Tensor:
    """The embedding table, which must be a 2-D float tensor of finite values."""
    if not isinstance(table, torch.Tensor) or table.ndim != 2 or not table.is_floating_point() or 0 in table.shape:
        raise ModelError(f"{path}: no usable embedding table (expected a 2-D float tensor; the file is corrupt)")
    if not torch.isfinite(table).all():
        raise ModelError(f"{path}: the embedding table holds NaN or infinite values (the file is corrupt)")
    return table


def _checked_rows(rows, pieces: int, table_rows: int, path: Path) -> np.ndarray:
    """Piece id -> row map: one integer per piece, each a row of the table or -1 (no row)."""
    ok = isinstance(rows, torch.Tensor) and rows.ndim == 1 and len(rows) == pieces and not rows.is_floating_point()
    if not ok or (len(rows) and (int(rows.min()) < -1 or int(rows.max()) >= table_rows)):
        raise ModelError(f"{path}: the piece-to-row map does not fit the table (the file is corrupt)")
    return rows.numpy().astype(np.int64)


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
    weight = _checked_table(state["state_dict"]["embedding.weight"], path)
    tokenizer = Tokenizer(sp_bytes, bool(args.get("lower_case", True)), source=sp_model)
    pieces = [tokenizer.sp.id_to_piece(i) for i in range(len(tokenizer))]
    piece_rows = _checked_rows(torch.tensor([vocab.get(p, -1) for p in pieces]), len(pieces), len(weight), path)
    config = {"legacy_args": _plain(args), "source": "original-release"}
    return SPModel(tokenizer, weight, config, piece_rows=piece_rows, unk_row=int(vocab[LEGACY_UNK]))


def read_sp_model(path: str | os.PathLike) -> bytes:
    """A sentencepiece model file's bytes, checked to load; a ModelError naming the file otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ModelError(f"{path}: cannot read the sentencepiece model ({(e.strerror or str(e)).lower()})") from None
    Tokenizer(data, lowercase=False, source=path)
    return data


def train_sentencepiece(text_file: str | os.PathLike, vocab_size: int, num_threads: int | None = None) -> bytes:
    """Train a unigram sentencepiece model (character coverage 0.995) and return its bytes.

    The text should already be lowercased for a lowercasing model. The vocabulary is capped at what
    the text supports, so tiny corpora still train.
    """
    buf = io.BytesIO()
    common = dict(
        input=str(text_file),
        model_writer=buf,
        model_type="unigram",
        character_coverage=0.995,
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        num_threads=num_threads or os.cpu_count() or 1,
        minloglevel=2,
    )
    try:
        spm.SentencePieceTrainer.train(vocab_size=vocab_size, **common)
    except RuntimeError as e:
        if "Vocabulary size too high" not in str(e):
            raise
        cap = int(str(e).rsplit("<=", 1)[-1].strip(" .\n"))
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(vocab_size=cap, **{**common, "model_writer": buf})
    return buf.getvalue()
