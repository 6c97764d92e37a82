"""Our model files: the one description of the checkpoint format (its fields, versions, types and checks, which both
readers use: `static_from_checkpoint` here and models.from_checkpoint), and the torch-free reader of the torch zip
format, within a budget: every pickle is walked before it is read (its size, its operations, its codecs), each
storage read once, and nothing pickled is ever run."""

from __future__ import annotations

import argparse
import io
import pickle
import pickletools
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from paraphrastic.fileio import ModelError
from paraphrastic.pieces import Tokenizer, TokenizerLoad
from paraphrastic.static import SPEncoder, StoredRows

FORMAT = "paraphrastic-sp"
FORMAT_VERSION = 1
INT8_VERSION = 2  # a table stored as int8 rows with row scales; earlier readers refuse it by version, not as corrupt


STORAGES = {"FloatStorage": np.float32, "HalfStorage": np.float16, "BFloat16Storage": np.uint16,
            "CharStorage": np.int8, "LongStorage": np.int64, "IntStorage": np.int32}  # fmt: skip


def _tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 for a contiguous tensor, as a numpy array over its storage."""
    count = int(np.prod(size)) if size else 1
    if offset < 0 or offset + count > len(storage) or tuple(stride) != tuple(contiguous_strides(size)):
        raise ValueError("not a contiguous tensor within its storage")
    return storage[offset : offset + count].reshape(size)


def contiguous_strides(size: tuple) -> list[int]:
    strides, step = [], 1
    for n in reversed(size):
        strides.insert(0, step)
        step *= n
    return strides


MAX_PICKLE_BYTES = 64 << 20  # a model's pickle: its config and sentencepiece model (a few MB); tensors lie beside it
MAX_PICKLE_OPS = 2_000_000  # ours hold hundreds (a word model: two a word); each makes at most one small object


class _Hostile(pickle.UnpicklingError):
    """A model file's pickle that asks for more than any model of ours needs: refused before it is read."""


class _Unpickler(pickle.Unpickler):
    """A torch-format pickle with tensors as numpy arrays, each storage read once by `storage(key, dtype, count)`, and
    only the callables our checkpoints use: any other stops it, so nothing is run. Without `storage` it scans (for
    torch.load, which reads the file next): nothing is read, and any other callable stands in as a no-op."""

    def __init__(self, file, storage: Callable[[str, np.dtype, int], np.ndarray] | None = None):
        super().__init__(file)
        self.storage, self.storages = storage, {}

    def find_class(self, module: str, name: str):
        if (module, name) == ("_codecs", "encode"):
            return _Named(latin1)
        if (module, name) == ("collections", "OrderedDict"):
            return _Named(OrderedDict)
        if self.storage is None:
            return _Stub
        if module == "torch" and name in STORAGES:
            return _Named(np.dtype(STORAGES[name]))
        if (module, name) != ("torch._utils", "_rebuild_tensor_v2"):
            raise pickle.UnpicklingError(f"{module}.{name}")
        return _Named(_tensor)

    def persistent_load(self, pid):
        if self.storage is None:
            return _Stub()
        kind, dtype, key, _, count = pid
        if kind != "storage" or not isinstance(getattr(dtype, "target", None), np.dtype) or not isinstance(key, str):
            raise pickle.UnpicklingError("not a tensor storage")
        if key not in self.storages:  # a storage named again is the same array, never read twice
            self.storages[key] = self.storage(key, dtype.target, count)
        return self.storages[key]


class _Named:
    """What a pickle may name (a function, a class, a storage's dtype), held so that the pickle cannot set its state:
    BUILD on the shared object itself would change it for the whole process."""

    __slots__ = ("target",)

    def __init__(self, target):
        self.target = target

    def __call__(self, *args):
        return self.target(*args)

    def __setstate__(self, state):
        raise pickle.UnpicklingError("it sets the state of a function or class")


class _Stub:
    """Whatever a scanned pickle builds with a callable other than ours: it takes anything and holds nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Stub()

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, item):
        pass

    def extend(self, items):
        pass


def latin1(text, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """`_codecs.encode` as pickle's protocol 2 uses it, to store bytes as latin1 text; any other codec (one that
    could double its input, again and again) is refused."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Hostile(
            f"it applies the codec {str(encoding)[:40]!r} to {type(text).__name__}, which no model file does"
        )
    return text.encode("latin1")


def count_ops(f, path: Path, budget: int = MAX_PICKLE_OPS) -> int:
    """Walk one pickle of `f` by its operations and refuse one of more than `budget` (each may make an object, so
    the walk bounds the memory of reading it); returns the operations left."""
    for op, _, _ in pickletools.genops(f):
        budget -= 1
        if budget < 0:
            raise _Hostile(f"its pickle holds more than {MAX_PICKLE_OPS:,} operations, beyond any model file")
        if op.name == "STOP":
            break
    return budget


def _pickle_member(archive: zipfile.ZipFile) -> zipfile.ZipInfo | None:
    """A torch zip's one data.pkl, refused when it inflates past MAX_PICKLE_BYTES; None when there is not one."""
    pickles = [info for info in archive.infolist() if info.filename.endswith("/data.pkl")]
    if len(pickles) != 1:
        return None
    if pickles[0].file_size > MAX_PICKLE_BYTES:
        raise _Hostile(f"its data.pkl is {pickles[0].file_size:,} bytes, more than any model's ({MAX_PICKLE_BYTES:,})")
    return pickles[0]


def inflation_refusal(members: list[zipfile.ZipInfo], size: int) -> str | None:
    """Why a zip (torch's format) of `size` bytes is a zip bomb, or None: a member inflating past 64 MiB at a ratio
    over 100, or members inflating past the file by more than 64 MiB together (torch stores tensors uncompressed:
    a model's members hold no more than its own bytes)."""
    for info in members:
        if info.file_size > (64 << 20) and info.file_size > 100 * max(info.compress_size, 1):
            return f"member {info.filename} inflates {info.compress_size:,} bytes to {info.file_size:,}"
    total = sum(info.file_size for info in members)
    if total > size + (64 << 20):
        return f"its {len(members)} members inflate to {total:,} bytes from a file of {size:,}"
    return None


def read_pickle(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, storage=None, scanned=None):
    """A torch zip's pickle, walked by its operations first (count_ops), then unpickled (`storage`: see
    _Unpickler; without it, a scan). It is inflated once, into memory (at most MAX_PICKLE_BYTES: _pickle_member),
    where the walk's many small reads cost a fifth of what they cost from the zip's stream. `scanned` is given
    what a scan makes of it (plain values read, no storage) before the storages are read."""
    try:
        with archive.open(info) as f:
            data = io.BytesIO(f.read())
    except zipfile.BadZipFile as e:  # its CRC-32: refused here, as torch would read it unchecked
        if "CRC" not in str(e):
            raise
        raise bad_crc(info) from None
    count_ops(data, path)
    if scanned is not None:
        data.seek(0)
        scanned(_Unpickler(data).load())
    data.seek(0)
    return _Unpickler(data, storage).load()


def scan_model_file(path: Path) -> None:
    """Refuse, before torch reads it, a model file whose pickle asks for more than any model needs (a codec applied
    again and again, a pickle that inflates or holds millions of operations): a ModelError within a bounded time and
    memory), or one whose stored bytes fail their CRC-32 (torch reads them unchecked). What this cannot parse is left
    to torch.load to describe."""
    try:
        with open(path, "rb") as raw:
            if zipfile.is_zipfile(raw):
                with zipfile.ZipFile(raw) as archive:
                    if (info := _pickle_member(archive)) is None:
                        return
                    read_pickle(archive, info, path)
                    check_stored(archive)
                return
            budget = MAX_PICKLE_OPS
            for _ in range(5):  # the legacy format: magic, protocol, system, the object, the storage keys
                at = raw.tell()
                budget = count_ops(raw, path, budget)
                end = raw.tell()
                raw.seek(at)
                _Unpickler(raw).load()
                raw.seek(end)
    except _Hostile as e:
        raise refused(path, e) from None
    except Exception:  # noqa: BLE001 - not ours to describe: torch.load reads the file and names the fault
        return


def refused(path: Path, error: _Hostile) -> ModelError:
    return ModelError(f"{path}: refused: {error} (the file is corrupt or hostile)")


def data_offset(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> int:
    """Where a member's bytes begin in the archive's file (after its local header, whose extra field may differ
    from the central directory's)."""
    archive.fp.seek(member.header_offset)
    header = archive.fp.read(zipfile.sizeFileHeader)
    if len(header) != zipfile.sizeFileHeader or header[:4] != zipfile.stringFileHeader:
        raise _Hostile(f"member {member.filename} has no local header where the directory says")
    names, extra = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    return member.header_offset + zipfile.sizeFileHeader + names + extra


def read_stored(archive: zipfile.ZipFile, member: zipfile.ZipInfo, out: np.ndarray) -> np.ndarray:
    """A stored (uncompressed) member's bytes read straight into `out`, checked against its CRC-32 as zipfile checks
    it, in a third of the time of zipfile's reader, which copies through its buffers in small chunks (9 against 27
    ms for the shipped model's table). A file that fails is refused: torch would read it unchecked."""
    archive.fp.seek(data_offset(archive, member))
    if archive.fp.readinto(memoryview(out).cast("B")) != member.file_size or zlib.crc32(out) != member.CRC:
        raise bad_crc(member)
    return out


def check_stored(archive: zipfile.ZipFile) -> None:
    """Every stored member's CRC-32, read in chunks: what torch.load skips."""
    for member in archive.infolist():
        if member.compress_type != zipfile.ZIP_STORED:
            continue  # zipfile checks what it inflates
        archive.fp.seek(data_offset(archive, member))
        crc, left = 0, member.file_size
        while left and (chunk := archive.fp.read(min(left, 1 << 20))):
            crc, left = zlib.crc32(chunk, crc), left - len(chunk)
        if left or crc != member.CRC:
            raise bad_crc(member)


def bad_crc(member: zipfile.ZipInfo) -> _Hostile:
    """The refusal of a member whose bytes fail their CRC-32 (torch would read them unchecked)."""
    return _Hostile(f"member {member.filename} fails its CRC-32")


def read_checkpoint(path: Path, early: list | None = None) -> dict | None:
    """Our SP checkpoint's contents, tensors as numpy arrays, read without torch within scan_model_file's budget (a
    ModelError beyond it); None for any other file (a legacy or general model, a folder, a damaged or foreign file:
    models.load_model reads it or says why not). Given a list `early`, the file's tokenizer starts building in a
    thread (Tokenizer.in_thread, put in the list) once the pickle is scanned, while the storages are read: the
    load then takes the longer of the two, not their sum; static_from_checkpoint takes it."""
    if not path.is_file():  # a pipe or device is never opened here (reading it would wait or consume it)
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            if why := inflation_refusal(archive.infolist(), path.stat().st_size):
                raise _Hostile(why)
            info = _pickle_member(archive)
            if info is None or info.compress_type != zipfile.ZIP_STORED:  # torch stores its pickle as it is
                return None
            prefix = info.filename.rsplit("/", 1)[0]

            def storage(key: str, dtype: np.dtype, count: int) -> np.ndarray:
                member = archive.getinfo(f"{prefix}/data/{key}")
                if member.compress_type != zipfile.ZIP_STORED or member.file_size != count * dtype.itemsize:
                    raise pickle.UnpicklingError("a storage of another size")
                return read_stored(archive, member, np.empty(count, dtype))

            def tokenizer_early(scan) -> None:
                if (
                    not isinstance(scan, dict)
                    or scan.get("format") != FORMAT
                    or not isinstance(scan.get("sp_model"), bytes)
                    or "piece_index" in scan  # the tokenizer is cut to each small job's pieces: nothing to build
                ):
                    return
                config = scan.get("config")
                if isinstance(config, dict) and isinstance(config.get("lowercase"), bool):
                    early.append(Tokenizer.in_thread(scan["sp_model"], config["lowercase"], path))

            scanned = tokenizer_early if early is not None else None  # the scan costs a pass: only for a taker
            state = read_pickle(archive, info, path, storage, scanned=scanned)
    except _Hostile as e:
        raise refused(path, e) from None
    except Exception:  # noqa: BLE001 - any other fault: the torch loader reads the file again and names it
        return None
    if not isinstance(state, dict) or not isinstance(state.get("format"), str) or state["format"] != FORMAT:
        return None
    return state


def checkpoint_fields(state: dict, path: Path, early: TokenizerLoad | None = None) -> dict:
    """The fields of one of our checkpoints (`Model.checkpoint()`), checked: the one description of the format that
    both readers use, on numpy arrays (here) or torch tensors (models.py) alike. `format_version` 1 holds a 2-D float
    `embedding`; 2 holds it as int8 rows with bfloat16 row scales (`embedding_scale`, (rows, 1)). `config` is plain
    data with `lowercase` (bool) and `encoder` (str, default "sp"; "parts" for a general model); `sp_model` is a
    sentencepiece model's bytes, `piece_index` its `pieces.piece_index` (optional: a small job's tokenizer is
    then cut to its pieces); `piece_rows` (piece id -> row, -1: none) and `unk_row` are optional. Returns the
    fields with a `tokenizer` for an SP model alone (`early`'s, where it was built from the same bytes); a ModelError
    names the first field that is wrong."""
    version = state.get("format_version")
    if type(version) is not int or version not in (FORMAT_VERSION, INT8_VERSION):
        raise ModelError(f"{path}: format version {version!r:.40} is not supported (this toolkit reads "
                         f"{FORMAT_VERSION} and {INT8_VERSION})")  # fmt: skip
    config = state.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("lowercase"), bool):
        raise ModelError(f"{path}: no valid config in the model file (it is corrupt)")
    check_small(config, path, "config")
    if not isinstance(config.get("encoder", "sp"), str):
        raise ModelError(f"{path}: its encoder is not named by a string (the file is corrupt)")
    table, scale = state.get("embedding"), state.get("embedding_scale")
    if version == INT8_VERSION:
        fits = dtype_name(table) == "int8" and table.ndim == 2 and dtype_name(scale) in ("bfloat16", "uint16")
        if not fits or tuple(scale.shape) != (len(table), 1):
            raise ModelError(f"{path}: the int8 table and its row scales do not fit (the file is corrupt)")
    elif dtype_name(table) not in ("float32", "float16", "bfloat16", "float64") or table.ndim != 2:
        raise ModelError(f"{path}: no usable embedding table (expected a 2-D float tensor; the file is corrupt)")
    if 0 in table.shape:
        raise ModelError(f"{path}: no usable embedding table (expected a 2-D float tensor; the file is corrupt)")
    fields = {"format_version": version, "config": config, "embedding": table, "embedding_scale": scale}
    if config.get("encoder", "sp") != "sp" or "parts" in config:
        return fields  # a general model: models.py reads its parts
    tokenizer = sp_tokenizer(state, path, early)
    rows, unk = state.get("piece_rows"), state.get("unk_row")
    if rows is None and len(table) != len(tokenizer):
        raise ModelError(f"{path}: {len(table)} embedding rows for {len(tokenizer)} pieces (the file is corrupt)")
    if rows is not None:
        rows = checked_rows(rows, len(tokenizer), len(table), path)
        if type(unk) is not int or not 0 <= unk < len(table):
            raise ModelError(f"{path}: unknown-token row {unk!r:.40} is not a row of the table (the file is corrupt)")
    return fields | {"tokenizer": tokenizer, "piece_rows": rows, "unk_row": unk if rows is not None else None}


def sp_tokenizer(state: dict, path: Path, early: TokenizerLoad | None = None) -> Tokenizer:
    """The tokenizer of a checkpoint's `sp_model` (bytes) and its config's lowercasing (checked before): `early`'s
    when it was started on the same."""
    if not isinstance(state.get("sp_model"), bytes):
        raise ModelError(f"{path}: no sentencepiece model inside the model file (it is corrupt)")
    lowercase = state["config"]["lowercase"]
    if early is not None and early.lowercase == lowercase and early.sp_model == state["sp_model"]:
        return early.result()
    return Tokenizer(state["sp_model"], lowercase, source=path, index=state.get("piece_index"))


def dtype_name(array) -> str | None:
    """An array's element type by name, numpy's or torch's alike ("float32", "int8", ...); None for no array."""
    return str(array.dtype).removeprefix("torch.") if hasattr(array, "dtype") and hasattr(array, "ndim") else None


def checked_rows(rows, pieces: int, table_rows: int, path: Path) -> np.ndarray:
    """A piece id -> row map (a numpy array or a torch tensor) as int64: one integer per piece, each a row of the table
    or -1 (no row)."""
    kind = dtype_name(rows)
    ok = kind is not None and kind.startswith(("int", "uint")) and rows.ndim == 1 and len(rows) == pieces
    if ok:
        rows = np.asarray(rows).astype(np.int64)
    if not ok or (len(rows) and (rows.min() < -1 or rows.max() >= table_rows)):
        raise ModelError(f"{path}: the piece-to-row map does not fit the table (the file is corrupt)")
    return rows


def checked_finite(table, path: Path):
    """The table, refused when it holds NaN or infinite values."""
    finite = table.isfinite().all() if hasattr(table, "isfinite") else np.isfinite(table).all()
    if not finite:
        raise ModelError(f"{path}: the embedding table holds NaN or infinite values (the file is corrupt)")
    return table


def static_from_checkpoint(state: dict, path: Path, early: TokenizerLoad | None = None) -> SPEncoder | None:
    """An SPEncoder from `read_checkpoint`'s contents (and the tokenizer it started `early`); None for a model that
    is not SP alone. The table stays as stored (StoredRows): a small job reads its own rows, a large one makes the
    float32 table once."""
    try:
        fields = checkpoint_fields(state, path, early)
    finally:  # an unsound file's error waits for the thread: nothing of it outlives the call
        if early is not None:
            early.join()
    if "tokenizer" not in fields:
        return None
    table = fields["embedding"]
    if fields["format_version"] == INT8_VERSION:  # int8 x a scale is finite where the scale x 128 is: check the scales
        with np.errstate(over="ignore"):
            scales = (fields["embedding_scale"].astype(np.uint32) << 16).view(np.float32)
            checked_finite(128 * scales, path)
        rows = StoredRows(table, scales)
    else:
        rows = StoredRows(checked_finite(table, path))
    return SPEncoder(fields["tokenizer"], rows, fields["config"], fields["piece_rows"], fields["unk_row"])


def check_small(value, path: Path, key: str, budget: int = 100_000, depth: int = 32) -> None:
    """Refuse a config too large or deep to be one (nested or shared so that walking it never ends, a
    "billion laughs"), or one holding anything but plain data: it is walked once with a budget of nodes and a depth
    limit."""
    stack, seen = [(value, 0)], 0
    while stack:
        item, level = stack.pop()
        seen += 1
        if seen > budget or level > depth:
            raise ModelError(f"{path}: its {key} is nested or repeated beyond any real config (the file is corrupt)")
        if isinstance(item, argparse.Namespace):
            item = vars(item)
        if isinstance(item, dict):
            stack += [(v, level + 1) for v in item.values()]
        elif isinstance(item, list | tuple):
            stack += [(v, level + 1) for v in item]
        elif item is not None and not isinstance(item, bool | int | float | str):
            raise ModelError(f"{path}: its {key} holds a {type(item).__name__}, not plain data (the file is corrupt)")
