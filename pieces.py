"""sentencepiece, both ways: text into piece ids (`Tokenizer`: the model's lowercasing, then sentencepiece, a long
text in pieces cut at spaces, the ids flat with each text's length), and training the sentencepiece model that a new
SP model tokenizes with: a unigram model of the training text, every ASCII letter, digit and mark it holds kept as a
piece, and optionally English folding (accents and typography dropped) written into the model as normalization
rules, so that the folding travels inside the model file."""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import os
import string
import sys
import tempfile
import threading
import unicodedata
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from paraphrastic.fileio import ModelError, first_sentence

SP_BATCH = 64  # texts from which sentencepiece's call on a list (a pool of threads) beats one call a text
SEGMENT_CHARS = 1 << 16  # a longer text is tokenized in pieces cut at spaces (ids as Python ints: ~140 bytes a piece)
SMALL_CHARS = 4096  # characters a tokenizer reads through cut vocabularies (`CutVocabulary`) before it builds the whole
NORMAL, USER_DEFINED = 1, 4  # sentencepiece's piece types


class TokenizerLoad(threading.Thread):
    """Tokenizer.in_thread's thread: what it built, or what it raised, given by `result`."""

    def __init__(self, kind: type, sp_model: bytes, lowercase: bool, source):
        super().__init__(daemon=True)
        self.kind, self.sp_model, self.lowercase, self.source, self.made = kind, sp_model, lowercase, source, None
        self.start()

    def run(self) -> None:
        try:
            self.made = self.kind(self.sp_model, self.lowercase, self.source)
        except BaseException as e:  # noqa: BLE001 - raised by result(), in the caller's thread
            self.made = e

    def result(self) -> Tokenizer:
        self.join()
        if isinstance(self.made, BaseException):
            raise self.made
        return self.made


def cased(texts: Sequence[str], lowercase: bool) -> list[str]:
    """The texts lowercased when the model lowercases, as a list (every tokenizer, SP's included)."""
    return list(map(str.lower, texts)) if lowercase else list(texts)


class Tokenizer:
    """Sentencepiece plus the model's lowercasing; turns a batch of texts into flat ids + offsets."""

    kind = "sp"

    def __init__(self, sp_model: bytes, lowercase: bool, source: str | os.PathLike | None = None, index=None):
        """`index`: the model file's `piece_index`, with which a small job tokenizes through a `CutVocabulary`
        and the whole model is built only when a job needs it (`sp`); without one it is built now."""
        self.sp_model, self.lowercase, self.source = sp_model, lowercase, source
        self.cut = CutVocabulary(sp_model, index, source) if index is not None else None
        self.cut_chars = 0  # characters tokenized through `cut`, up to SMALL_CHARS
        if self.cut is None:
            self.sp  # noqa: B018 - built and checked now

    @functools.cached_property
    def sp(self) -> spm.SentencePieceProcessor:
        """The whole sentencepiece model, built at first use where the model file has a piece index."""
        return built(self.sp_model, self.source)

    @property
    def cutting(self) -> bool:
        """Whether texts go through the cut vocabulary: there is one and the whole model is not built yet."""
        return self.cut is not None and "sp" not in self.__dict__

    def __len__(self) -> int:
        return len(self.cut.sizes) if self.cut is not None else self.sp.get_piece_size()

    @classmethod
    def in_thread(cls, sp_model: bytes, lowercase: bool, source=None) -> TokenizerLoad:
        """A Tokenizer built in a thread, taken with `.result()`: sentencepiece lets go of the GIL while it builds
        its model (two thirds of reading a model file), so a reader starts it as soon as it has the bytes and reads
        the table meanwhile."""
        return TokenizerLoad(cls, sp_model, lowercase, source)

    @property
    def unk_id(self) -> int:
        return self.cut.unk_id if self.cut is not None else self.sp.unk_id()

    @functools.cached_property
    def index(self) -> dict | None:
        """The model's `piece_index`, as a model file keeps it."""
        return piece_index(self.sp_model)

    def piece_id(self, piece: str) -> int:
        """The id of a piece (the unknown piece's for none), without building the whole model for it."""
        if self.cutting:
            return self.cut.ids_of([piece]).get(piece, self.unk_id)
        return self.sp.piece_to_id(piece)

    def encode(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Piece ids of each text (lowercased first when the model was trained lowercased). sentencepiece's call on
        a list starts a pool of threads (70 us), so fewer than SP_BATCH texts are tokenized one call a text. The
        first SMALL_CHARS characters of a process go through the cut vocabulary, where the model file has an index."""
        texts = cased(texts, self.lowercase)
        try:
            if self.cutting:
                chars = sum(map(len, texts))
                if self.cut_chars + chars <= SMALL_CHARS:
                    self.cut_chars += chars
                    return self.cut.encode(texts)
            if len(texts) < SP_BATCH:
                return [self.sp.encode(text) for text in texts]
            return self.sp.encode(texts, num_threads=num_threads)
        # pybind's "Unable to cast" (or the cut vocabulary's encode): a text that is not UTF-8 (a lone surrogate)
        except (RuntimeError, UnicodeEncodeError):
            for text in texts:
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ValueError(
                        f"the text {text[:40]!r}{'...' if len(text) > 40 else ''} holds {text[e.start]!r}, a lone "
                        "surrogate, which is no Unicode character: decode your input with errors='replace'"
                    ) from None
            raise

    def encode_flat(self, texts: Sequence[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids, per-text lengths) of a batch; a text longer than SEGMENT_CHARS is tokenized in pieces cut at
        spaces, so that the memory it takes follows SEGMENT_CHARS, not its length."""
        if max(map(len, texts), default=0) <= SEGMENT_CHARS:
            return flatten(self.encode(texts, num_threads))
        flats, lengths = [], []
        for long, group in itertools.groupby(texts, key=lambda text: len(text) > SEGMENT_CHARS):
            if not long:
                flat, lens = flatten(self.encode(list(group), num_threads))
                flats.append(flat)
                lengths.append(lens)
                continue
            for text in group:
                flats.append(np.concatenate([flatten(self.encode([piece]))[0] for piece in segments(text)]))
                lengths.append([len(flats[-1])])
        return np.concatenate(flats), np.concatenate(lengths).astype(np.int64)


def built(sp_model: bytes, source=None) -> spm.SentencePieceProcessor:
    """A sentencepiece model from its bytes, or a ModelError naming `source` when they are not one."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(sp_model)
    except (RuntimeError, OSError, TypeError) as e:
        where = f"{source}: " if source is not None else ""
        reason = first_sentence(e).removeprefix("INTERNAL: ")
        reason = "it does not parse" if "ParseFromArray" in reason else reason
        raise ModelError(f"{where}not a valid sentencepiece model, truncated or corrupt ({reason})") from None
    return sp


def varint(data: bytes, i: int) -> tuple[int, int]:
    """Decode a protobuf varint at `i`: (value, next index)."""
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def proto_fields(data: bytes) -> dict[int, int | bytes]:
    """The first value of each field of a serialized protobuf message (enough for sentencepiece's specs)."""
    fields: dict[int, int | bytes] = {}
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = varint(data, i)
        elif wire == 2:
            size, i = varint(data, i)
            value, i = data[i : i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i : i + size], i + size
        else:
            raise ModelError(f"the sentencepiece model is not a protobuf message (wire type {wire})")
        fields.setdefault(key >> 3, value)
    return fields


def piece_index(sp_model: bytes) -> dict | None:
    """What a model file keeps beside its sentencepiece model so that a small job need not build the whole of it
    (0.1 s for 80,000 pieces, a third of a short command): each piece's entry size in the model's bytes, the crc32s
    of the pieces, sorted, with the id of each, the pieces always kept (not NORMAL ones, the lowest and highest
    scores: what the unknown piece's score is made of) and the longest piece. None for a model that a cut vocabulary
    may not tokenize as the whole does: not unigram, with user-defined pieces, or not laid out as sentencepiece
    writes it (the pieces first)."""
    sizes, hashes, always, scores, longest, i = [], [], [], {}, 0, 0
    try:
        while i < len(sp_model) and sp_model[i] == 0x0A:  # field 1 (a piece), length-delimited
            size, start = varint(sp_model, i + 1)
            entry = proto_fields(sp_model[start : start + size])
            piece, kind = entry.get(1, b""), entry.get(3, NORMAL)
            if start != i + 2 or size > 127 or sp_model[start : start + 2] != bytes([0x0A, len(piece)]):
                return None  # the layout CutVocabulary reads: one-byte sizes, the piece's text first
            if kind == USER_DEFINED:
                return None
            if kind == NORMAL:
                scores[len(sizes)] = np.frombuffer(entry.get(2, bytes(4)), np.float32)[0]
            else:
                always.append(len(sizes))
            sizes.append(size)
            hashes.append(zlib.crc32(piece))
            longest = max(longest, len(piece.decode()))
            i = start + size
        tail = proto_fields(sp_model[i:])
        unigram = proto_fields(tail.get(2, b"")).get(3, 1) == 1  # the trainer spec's model_type
    except (ModelError, IndexError, UnicodeDecodeError):
        return None
    if not sizes or 1 in tail or not unigram or not scores:
        return None
    always += [min(scores, key=scores.get), max(scores, key=scores.get)]
    hashes = np.array(hashes, dtype=np.uint32).view(np.int32)
    order = np.argsort(hashes, kind="stable")
    return {"sizes": np.array(sizes, dtype=np.int8), "hashes": hashes[order], "ids": order.astype(np.int32),
            "always": np.unique(np.array(always, dtype=np.int32)), "longest": longest}  # fmt: skip


class CutVocabulary:
    """A sentencepiece model tokenizing each batch with only the pieces its normalized texts hold as substrings
    (found by `piece_index`'s hashes, checked against the model's bytes), plus those always kept: a unigram
    model's best segmentation uses no other piece, so the ids are the whole model's (tests/test_static.py checks
    it), for a fraction of a millisecond of building instead of 0.1 s. Its index is checked against the model's
    bytes here; a ModelError names `source` when they disagree."""

    def __init__(self, sp_model: bytes, index: dict, source=None):
        where = f"{source}: " if source is not None else ""
        try:
            self.sizes, self.hashes, self.ids, self.always = (
                np.asarray(index[k]) for k in ("sizes", "hashes", "ids", "always")
            )
            self.longest = index["longest"]
            n = len(self.sizes)
            fits = (
                type(self.longest) is int
                and [a.dtype for a in (self.sizes, self.hashes, self.ids, self.always)] == ["int8", *["int32"] * 3]
                and len(self.hashes) == len(self.ids) == n > 0
                and (self.sizes > 0).all()
            )
            if fits:
                self.starts = np.concatenate([[0], np.cumsum(self.sizes.astype(np.int64) + 2)])
                model = np.frombuffer(sp_model, np.uint8)
                fits = (
                    self.starts[-1] < len(model)
                    and (model[self.starts[:-1]] == 0x0A).all()
                    and (model[self.starts[:-1] + 1] == self.sizes).all()
                    and (self.hashes[1:] >= self.hashes[:-1]).all()
                    and (np.bincount(self.ids, minlength=n) == 1).all()
                    and ((self.always >= 0) & (self.always < n)).all()
                    and 1 not in proto_fields(sp_model[self.starts[-1] :])  # no piece after the indexed ones
                )
        except (KeyError, TypeError, ValueError, IndexError, ModelError):
            fits = False
        if not fits:
            raise ModelError(f"{where}its piece index does not fit its sentencepiece model (the file is corrupt)")
        self.sp_model, self.source = sp_model, source
        self.tail = sp_model[self.starts[-1] :]
        base = self.processor(self.always.tolist())  # checks the rest of the model too
        self.unk_id = int(self.always[base.unk_id()])
        try:
            self.normalizer = spm.SentencePieceNormalizer(model_proto=self.tail)
        except (RuntimeError, OSError, TypeError) as e:
            raise ModelError(f"{where}not a valid sentencepiece model ({first_sentence(e)})") from None

    def processor(self, ids: list[int]) -> spm.SentencePieceProcessor:
        """The model with only the pieces `ids` (ascending), in their order: a reduced id k is ids[k]."""
        entries = b"".join(self.sp_model[self.starts[k] : self.starts[k + 1]] for k in ids)
        return built(entries + self.tail, self.source)

    def ids_of(self, strings: Sequence[str]) -> dict[str, int]:
        """The id of each of `strings` that is a piece."""
        found, encoded = {}, [s.encode() for s in strings]
        crcs = np.fromiter(map(zlib.crc32, encoded), np.uint32, len(encoded)).view(np.int32)
        lows, highs = np.searchsorted(self.hashes, crcs, "left"), np.searchsorted(self.hashes, crcs, "right")
        for k in np.flatnonzero(highs > lows):
            for piece_id in self.ids[lows[k] : highs[k]].tolist():
                start = self.starts[piece_id] + 4  # the entry's tag and size, the piece's tag and size
                if (
                    self.sp_model[start - 1] == len(encoded[k])
                    and self.sp_model[start : start + len(encoded[k])] == encoded[k]
                ):
                    found[strings[k]] = piece_id
        return found

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of each text (already cased), the whole model's."""
        substrings = set()
        for text in map(self.normalizer.Normalize, texts):
            for i in range(len(text)):
                substrings.update(text[i : i + k] for k in range(1, min(self.longest, len(text) - i) + 1))
        keep = sorted({*self.ids_of(list(substrings)).values(), *self.always.tolist()})  # not np.unique: numpy.ma
        sp = self.processor(keep)
        return [[keep[i] for i in ids] for ids in sp.encode(list(texts))]


def segments(text: str, size: int = SEGMENT_CHARS) -> list[str]:
    """`text` cut into pieces of at most `size` characters, each cut at the last space of its second half where
    there is one. Sentencepiece starts a piece at every space, so the pieces tokenize as the whole text does (but
    for rare ties of equal score, which a long text's summed scores break either way)."""
    out, start = [], 0
    while start < len(text):
        stop = min(len(text), start + size)
        if stop < len(text):
            space = text.rfind(" ", start + size // 2, stop)
            stop = space if space > start else stop
        out.append(text[start:stop])
        start = stop
    return out


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


def fill_empty(flat: np.ndarray, lengths: np.ndarray, unk: int) -> tuple[np.ndarray, np.ndarray]:
    """Give every empty bag the single id `unk`, so that no sentence pools over nothing."""
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        flat = np.insert(flat, offsets_of(lengths)[empty], unk)
        lengths = lengths.copy()
        lengths[empty] = 1
    return flat, lengths


def ascii_marks_in(text_file: str | os.PathLike, folding: bool = False) -> str:
    """The ASCII letters, digits and punctuation marks that occur in a text file (read in chunks), in a fixed order;
    with `folding`, also those that its other characters fold to ('’' -> "'")."""
    marks, seen = string.ascii_letters + string.digits + string.punctuation, set()
    with open(text_file, encoding="utf-8") as f:
        while chunk := f.read(1 << 24):
            seen.update(chunk)
    if folding:
        seen |= {c for char in seen if not char.isascii() for c in fold(char)}
    return "".join(c for c in marks if c in seen)


TYPOGRAPHY = str.maketrans(dict.fromkeys("‘’‚‛′´", "'") | dict.fromkeys("“”„‟″", '"') | dict.fromkeys("‐‑‒–—―−", "-"))


def fold(char: str) -> str:
    """What a folding model reads for one character: compatibility forms and accents dropped (NFKD without its
    combining marks: "é" -> "e", "ﬁ" -> "fi"), curly quotes and dashes made ASCII, control and format characters
    removed. English text from the web spells the same word all these ways; the teachers read them alike."""
    if unicodedata.category(char) in ("Cc", "Cf"):
        return " " if char in "\t\n\r" else ""
    decomposed = unicodedata.normalize("NFKD", char)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).translate(TYPOGRAPHY)


def folding_rules() -> str:
    """sentencepiece normalization rules (TSV: code points -> code points) that apply `fold` to every character
    it changes; trained into a model, the folding travels inside the model file."""
    rules = []
    for code in range(1, sys.maxunicode + 1):  # not NUL: sentencepiece cannot key it
        char = chr(code)
        if 0xD800 <= code < 0xE000 or unicodedata.category(char) == "Cn" or (target := fold(char)) == char:
            continue
        rules.append(f"{code:X}\t{' '.join(f'{ord(c):X}' for c in target)}")
    return "\n".join(rules) + "\n"


def train_sentencepiece(
    text_file: str | os.PathLike,
    vocab_size: int,
    num_threads: int | None = None,
    character_coverage: float = 0.995,
    folding: bool = False,
) -> bytes:
    """Train a unigram sentencepiece model and return its bytes. Characters outside the most frequent
    `character_coverage` of the text become unknown (raise it for text with many characters, such as Chinese),
    except the ASCII letters, digits and punctuation marks it holds, which are always pieces: without that, English
    Wikipedia at 0.995 lost the letters j, q and z, the digits 4, 6 and 7, '?', '%' and '!'.
    `folding` replaces sentencepiece's NFKC normalization with `fold` (for English: "café" reads as "cafe").

    The text should already be lowercased for a lowercasing model. `vocab_size` is an upper bound: a small
    text gets the pieces it supports (sentencepiece's soft limit), so tiny corpora still train.
    """
    buf = io.BytesIO()
    # a folder only for the folding rules: a run killed while sentencepiece trains (it holds Python's signals until
    # it is done) leaves none behind otherwise
    with tempfile.TemporaryDirectory() if folding else contextlib.nullcontext() as tmp:
        rules = {}
        if folding:
            (Path(tmp) / "rules.tsv").write_text(folding_rules(), encoding="utf-8")
            rules = {"normalization_rule_tsv": str(Path(tmp) / "rules.tsv")}
        spm.SentencePieceTrainer.train(
            input=str(text_file),
            model_writer=buf,
            model_type="unigram",
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            character_coverage=character_coverage,
            required_chars=ascii_marks_in(text_file, folding),
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=2,
            **rules,
        )
    return buf.getvalue()
