"""Training the sentencepiece model that a new SP model tokenizes with: a unigram model of the training text, every
ASCII letter, digit and mark it holds kept as a piece, and optionally English folding (accents and typography
dropped) written into the model as normalization rules, so that the folding travels inside the model file."""

from __future__ import annotations

import io
import os
import string
import sys
import tempfile
import unicodedata
from pathlib import Path

import sentencepiece as spm


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
    with tempfile.TemporaryDirectory() as tmp:
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
