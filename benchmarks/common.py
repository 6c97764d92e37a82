"""Shared pieces of the benchmarks: the real data, a fixed English sentence sample, a cached
50,000-piece sentencepiece model, and a header that says what machine the figures come from."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from paraphrastic import pieces

ROOT = Path(__file__).resolve().parents[1]

DATA = Path(os.environ.get("PARAPHRASTIC_DATA", ROOT.parent / "shared" / "data"))
CACHE = Path(__file__).resolve().parent / ".cache"


def english_sentences() -> list[str]:
    """Unique English sentences of the shared training data (captions, ASSET, every English bitext
    side), in a fixed order: the same list on every machine that has ../shared/data."""
    from paraphrastic.teacher import english_training_sentences  # teacher imports torch: only when asked

    if not DATA.is_dir():
        sys.exit(f"error: {DATA} not found: the benchmarks read the real data in ../shared/data")
    return english_training_sentences(DATA, skip_tatoeba=False)


def sentence_sample(n: int) -> list[str]:
    """The first `n` of the fixed English sentence order."""
    sentences = english_sentences()
    if len(sentences) < n:
        sys.exit(f"error: only {len(sentences)} English sentences found, {n} needed")
    return sentences[:n]


def write_repeated(path: Path, sentences: list[str], n: int) -> list[str]:
    """`n` lines of `sentences` repeated in order, written to `path` in UTF-8, one a line; returns them."""
    lines = [sentences[i % len(sentences)] for i in range(n)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return lines


def sp_model_50k() -> bytes:
    """A 50,000-piece unigram sentencepiece model of the English sentences, cached on disk."""
    path = CACHE / "en50k.model"
    if not path.exists():
        CACHE.mkdir(exist_ok=True)
        text = CACHE / "en.txt"
        text.write_text("\n".join(s.lower() for s in english_sentences()) + "\n", encoding="utf-8")
        path.write_bytes(pieces.train_sentencepiece(text, vocab_size=50_000))
    return path.read_bytes()


def cpu_name() -> str:
    """The CPU model, printed beside every speed figure (speeds differ between machines)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_header() -> str:
    """One paragraph naming the machine, versions and thread counts behind the figures (the versions read from
    the installed packages: a benchmark that never needs torch does not import it to print its version)."""
    versions = {name: metadata.version(name) for name in ("torch", "sentencepiece", "numpy")}
    return (
        f"machine: {cpu_name()}, {os.cpu_count()} cores; python {platform.python_version()}, "
        f"torch {versions['torch']}, sentencepiece {versions['sentencepiece']}, numpy {versions['numpy']}"
        + ("" if bytecode_cached() else NOT_COMPILED)
    )


NOT_COMPILED = (
    "; WARNING: the installed packages hold no compiled bytecode (installed under PYTHONDONTWRITEBYTECODE?): every "
    "process compiles what it imports, start-up figures are inflated; run python -m compileall on site-packages"
)


def bytecode_cached() -> bool:
    """Whether numpy's package holds its compiled bytecode, as a pip install leaves it: without it every Python process
    compiles its imports again (here: Ray's own processes at 45% of local throughput against 55% compiled)."""
    spec = importlib.util.find_spec("numpy")
    return spec is not None and Path(importlib.util.cache_from_source(spec.origin)).is_file()


def children(pid: int) -> list[int]:
    """The process ids of a process's children (none once it is gone)."""
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in found]
