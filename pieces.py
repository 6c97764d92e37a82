"""sentencepiece, both ways: text into piece ids (`Tokenizer`: the model's lowercasing, then sentencepiece, a long
text in pieces cut at spaces, the ids flat with each text's length), and training the sentencepiece model that a new
SP model tokenizes with: a unigram model of the training text, every ASCII letter, digit and mark it holds kept as a
piece, and optionally English folding (accents and typography dropped) written into the model as normalization
rules, so that the folding travels inside the model file."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import string
import sys
import tempfile
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from paraphrastic.fileio import ModelError, first_sentence

SP_BATCH = 64  # texts from which sentencepiece's call on a list (a pool of threads) beats one call a text
SEGMENT_CHARS = 1 << 16  # a longer text is tokenized in pieces cut at spaces (ids as Python ints: ~140 bytes a piece)


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

    def __init__(self, sp_model: bytes, lowercase: bool, source: str | os.PathLike | None = None):
        self.sp_model = sp_model
        self.lowercase = lowercase
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(sp_model)
        except (RuntimeError, OSError, TypeError) as e:
            where = f"{source}: " if source is not None else ""
            reason = first_sentence(e).removeprefix("INTERNAL: ")
            reason = "it does not parse" if "ParseFromArray" in reason else reason
            raise ModelError(f"{where}not a valid sentencepiece model, truncated or corrupt ({reason})") from None

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    @classmethod
    def in_thread(cls, sp_model: bytes, lowercase: bool, source=None) -> TokenizerLoad:
        """A Tokenizer built in a thread, taken with `.result()`: sentencepiece lets go of the GIL while it builds
        its model (two thirds of reading a model file), so a reader starts it as soon as it has the bytes and reads
        the table meanwhile."""
        return TokenizerLoad(cls, sp_model, lowercase, source)

    @property
    def unk_id(self) -> int:
        return self.sp.unk_id()

    def encode(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Piece ids of each text (lowercased first when the model was trained lowercased). sentencepiece's call on
        a list starts a pool of threads (70 us), so fewer than SP_BATCH texts are tokenized one call a text."""
        texts = cased(texts, self.lowercase)
        try:
            if len(texts) < SP_BATCH:
                return [self.sp.encode(text) for text in texts]
            return self.sp.encode(texts, num_threads=num_threads)
        except RuntimeError:  # pybind's "Unable to cast": a text that is not UTF-8 (a lone surrogate)
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
