"""Hostile model files, built here: each asks a reader for far more memory or time than any model needs, or holds
fields of the wrong type. Used by tests/test_bounds.py."""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from paraphrastic import models


def with_pickle(path: Path, pickle: bytes, compress: int = zipfile.ZIP_STORED) -> Path:
    """A torch-format zip at `path` whose data.pkl is `pickle` (stored, or deflated)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle, compress_type=compress, compresslevel=1)  # the fastest to build
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    return path


def unicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def codec_bomb(path: Path, times: int = 40, codec: str = "hex") -> Path:
    """`_codecs.encode(..., codec)` applied `times` times to two bytes: hex doubles its input each time."""
    ops = b"\x80\x03c_codecs\nencode\nq\x00" + b"h\x00" * (times - 1)
    ops += b"C\x02ab" + (unicode(codec) + b"\x86R") * times + b"."
    return with_pickle(path, ops)


def build_on_function(path: Path) -> Path:
    """BUILD (set the state of) an allowed function: the pickle would change a callable the reader shares."""
    return with_pickle(path, b"\x80\x02c_codecs\nencode\n}" + unicode("__defaults__") + b"N" + b"sb.")


def deflated_pickle(path: Path, size: int = 200 << 20) -> Path:
    """A data.pkl of `size` bytes of empty lists, deflated to a few hundred KB: gigabytes of objects once read."""
    return with_pickle(path, b"\x80\x02]" + b"]a" * ((size - 4) // 2) + b".", zipfile.ZIP_DEFLATED)


def shared_storage(path: Path, refs: int = 5000) -> Path:
    """One 1 MiB storage named by `refs` tensors (torch.save writes it once)."""
    table = torch.zeros(512, 512)
    torch.save({"format": models.FORMAT, "format_version": models.FORMAT_VERSION,
                "views": [table for _ in range(refs)]}, path)  # fmt: skip
    return path


def wrong_field(field: str) -> Callable[[Path], Path]:
    """Our checkpoint with one field of the wrong type."""

    def build(path: Path) -> Path:
        state = models.load_model().checkpoint()
        if field == "config.encoder":
            state["config"]["encoder"] = torch.tensor([1, 2])
        elif field == "piece_rows":
            state["piece_rows"], state["unk_row"] = list(range(len(state["embedding"]))), 0
        else:
            state[field] = torch.tensor([1, 2])
        torch.save(state, path)
        return path

    return build


HOSTILE = {
    "codec applied 40 times": codec_bomb,
    "unknown codec": lambda path: codec_bomb(path, 1, "no-such-codec"),
    "BUILD on an allowed function": build_on_function,
    "deflated data.pkl (200 MB)": deflated_pickle,
    "deflated data.pkl under 64 MiB": lambda path: deflated_pickle(path, 60 << 20),
    "one storage named 5,000 times": shared_storage,
    "format as an array": wrong_field("format"),
    "format_version as an array": wrong_field("format_version"),
    "config.encoder as an array": wrong_field("config.encoder"),
    "piece_rows as a list": wrong_field("piece_rows"),
}

# Each reader in a fresh process over every file: a line "NAME<TAB>error: ..." for a ModelError, "NAME<TAB>..." for
# anything else, and last the process's peak resident memory in KiB.
READERS = {
    "static": "from paraphrastic import load_encoder as load",
    "torch": "from paraphrastic.models import load_model as load",
}


def reader_script(reader: str, files: dict[str, Path]) -> str:
    return f"""{READERS[reader]}
from pathlib import Path
from paraphrastic.fileio import ModelError
for name, path in { ({k: str(v) for k, v in files.items()})!r}.items():
    try:
        load(path)
        print(f"{{name}}\tloaded")
    except ModelError as e:
        print(f"{{name}}\terror: {{e}}")
    except Exception as e:
        print(f"{{name}}\t{{type(e).__name__}}: {{e}}")
print("peak", Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0])
"""
