"""Reading user text safely and writing outputs atomically.

Every reader names the file and line of bad input; every writer goes through a temporary file that
is renamed into place only when complete, so an interrupted run never leaves a plausible-looking
partial output behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import gzip
import hashlib
import io
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

STDIN = Path("/dev/stdin")  # what an input named `-` reads: once, as it comes
NOT_REGULAR = "not a regular file (a pipe, FIFO or device): inputs are read more than once; save it to a file first"
DEFAULT_MAX_LINE_BYTES = 16 << 20
LINE_LIMIT_ENV = "PARAPHRASTIC_MAX_LINE_BYTES"
SHOWN = 10  # bad line numbers kept and named in a summary; the rest are counted
JOB_BYTES = 4 << 20  # text in one job (a chunk a worker embeds, a batch tokenized at once): memory follows bytes,
# not lines; a longer line goes alone
FLUSH_S = 0.25  # while a large output is written, its pages go to disk this often (see `flushing`)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # full disk, quota, file size limit (ulimit -f)


def install_hint(extra: str) -> str:
    """How to install an extra, quoted for every shell: for an installed package, and in a checkout."""
    return f'pip install "paraphrastic[{extra}]" (in a checkout: pip install -e ".[{extra}]")'


class Error(Exception):
    """An error the user can act on: its message names the file (and line) and says what to do, and
    run_cli prints it as one line and exits with `exit_code`, never a traceback."""

    exit_code = 2


class InputError(Error):
    """Bad user input: a missing, unreadable or malformed file or an argument that cannot work."""


class OutputError(Error):
    """An output that could not be written (full disk, file size limit)."""


class ModelError(Error):
    """A model file that cannot be used: missing, corrupt, foreign or unsafe."""


def first_sentence(error: Exception) -> str:
    """The first sentence of an exception's message (its type's name where it has none), for a one-line error."""
    text = str(error).strip().splitlines()[0].strip() if str(error).strip() else type(error).__name__
    return text.split(". ")[0].rstrip(".")


def open_binary(path: Path) -> BinaryIO:
    """Binary reader for a plain or gzip-compressed (.gz) file."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


PARTS_FOLDER_NAMES = ("_claim", "_temporary", "_manifest.parquet", "_SUCCESS")  # commit.py's bookkeeping names


def parts_folder_of(path: Path) -> Path | None:
    """The Ray engine's output folder (commit.py) that a file lies in (a part, a staged part, its bookkeeping), if
    any."""
    for folder in (path.parent, path.parent.parent):
        if any((folder / name).exists() for name in PARTS_FOLDER_NAMES):
            return folder
    return None


def refuse_same_file(output: str | os.PathLike | None, *inputs: str | os.PathLike | None) -> None:
    """Fail before any work when an output would overwrite one of the run's inputs (the same file under any name:
    a link, a relative path, a file inside an input folder), or a file of the Ray engine's output folder (a part,
    `_SUCCESS`: what its manifest promises would no longer hold). Callers pass models as the files their names
    stand for (static.model_path), so a shipped model's name or the default is checked too."""
    if output is not None and str(output) != "-" and (folder := parts_folder_of(Path(output).resolve())):
        raise InputError(f"{output}: lies in {folder}, an output folder of --engine ray; write the output elsewhere")
    if output is None or not Path(output).exists():
        return
    for item in inputs:
        if item is None or not Path(item).exists():
            continue
        inside = Path(item).rglob("*") if Path(item).is_dir() else [Path(item)]
        for path in inside:
            if path.is_file() and os.path.samefile(output, path):
                raise InputError(f"{output}: is also an input of this run ({item}); write the output elsewhere")


def file_digest(path: str | os.PathLike) -> str:
    """The sha256 of a file's whole content, streamed (about a second for a GB)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def input_path(name: str | os.PathLike) -> Path:
    """An input's name as a path: `-` is standard input (STDIN, or the file it is where it is one)."""
    if str(name) != "-":
        return Path(name)
    return Path(os.path.realpath(STDIN)) if STDIN.is_file() else STDIN


def open_input(path: str | os.PathLike, stream: bool = False) -> int:
    """Check that `path` is a readable file (or with `stream`, a pipe too) before any work starts; its bytes."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, expected a file")
    if not (p.is_file() or stream):
        raise InputError(f"{p}: {NOT_REGULAR}")
    try:
        return p.stat().st_size
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror})") from e


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


PACKED = "(unpack it, or pack it as .gz, which is read as it is)"
UTF16 = "UTF-16 text (as Windows tools often write it; iconv -f UTF-16 -t UTF-8 converts it)"
MAGIC = {b"\x93NUMPY": "a NumPy .npy", b"PK\x03\x04": "a zip archive (a .pt model?)", b"%PDF": "a PDF",
         b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"\x7fELF": "a program",
         b"\x89HDF": "an HDF5 file", b"PAR1": "a Parquet file", b"SQLite format 3": "an SQLite database",
         b"\x1f\x8b": "gzip-compressed (named .gz, it is read as it is)", b"\xfd7zXZ\x00": f"xz-compressed {PACKED}",
         b"\x28\xb5\x2f\xfd": f"zstd-compressed {PACKED}"}  # fmt: skip


def binary_kind(head: bytes) -> str | None:
    """What a file that starts with `head` is when it is not text: a known format by its magic number, many NUL
    bytes (text may hold a few; UTF-16 where every other byte is one), or bytes mostly undecodable as UTF-8
    (compressed or random data, or text in another encoding, whose vectors would be of U+FFFD); None for text."""
    for magic, kind in MAGIC.items():
        if head.startswith(magic):
            return kind
    nuls = head.count(0)
    if nuls > 8 and nuls > len(head) // 100:
        wide = max(head[0::2].count(0), head[1::2].count(0)) > 0.9 * nuls  # every other byte NUL: 16-bit units
        return UTF16 if head.startswith((b"\xff\xfe", b"\xfe\xff")) or wide else "binary data (NUL bytes)"
    text = head.decode("utf-8", "replace")
    bad = text.count("\ufffd") - head.decode("utf-8", "ignore").count("\ufffd")  # U+FFFD written as such is text
    if len(head) >= 512 and bad > 0.3 * len(text):
        return (f"undecodable bytes ({bad / len(text):.0%} of its first characters: compressed or binary data, or text "
                "in another encoding, which iconv -t UTF-8 converts)")  # fmt: skip
    return None


def refuse_binary(path: Path, head: bytes) -> None:
    """Refuse, as text, a file whose first bytes `head` say it is binary (binary_kind)."""
    if kind := binary_kind(head):
        raise InputError(f"{path}: {kind}, not UTF-8 text: give one sentence per line in UTF-8")


def iter_line_chunks(
    path: str | os.PathLike,
    chunk_lines: int = 65536,
    strict: bool = False,
    stats: dict | None = None,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[list[str]]:
    """Yield lines [start, stop) of a text file (all by default) in chunks of at most `chunk_lines` lines and
    about JOB_BYTES bytes, streaming from disk.

    Invalid UTF-8 is replaced (counted in `stats["invalid_utf8_lines"]`) unless `strict`.
    """
    stats = stats if stats is not None else {}
    stats.setdefault("invalid_utf8_lines", 0)
    for line_no, blob in iter_line_blocks(path, chunk_lines, start, stop):
        lines, bad = decode_raw(blob, Path(path), line_no, strict)
        stats["invalid_utf8_lines"] += bad
        yield lines


def iter_line_blocks(
    path: str | os.PathLike,
    chunk_lines: int = 65536,
    start: int = 0,
    stop: int | None = None,
    block: int = 1 << 20,
    offset: int | None = None,
    chunk_bytes: int = JOB_BYTES,
    stream: bool = False,
) -> Iterator[tuple[int, bytes]]:
    """(number of the first line, the bytes of up to `chunk_lines` whole lines and about `chunk_bytes` bytes, a
    longer line alone) over lines [start, stop), found by a vectorised newline search in reads of `block` bytes, so
    that a reader (the process feeding worker processes above all) spends its time per block, not per line;
    `decode_raw` makes them lines. A line over the limit is refused here, without reading it whole. `offset`: the
    byte where line `start` begins, when known (a seek instead of reading the lines before it); `stream`: a pipe
    may be read (once)."""
    path = Path(path)
    open_input(path, stream)
    limit, line_no = line_limit(), start + 1
    left = math.inf if stop is None else max(stop - start, 0)
    buf, marks = b"", np.zeros(0, dtype=np.int64)  # unsent bytes; the offsets of the newlines in them
    with reading(path), open_binary(path) as f:
        if not offset and not start:
            refuse_binary(path, f.peek(8192)[:8192])
        f.seek(offset) if offset is not None else skip_lines(f, start)
        while left:
            data = (f.read1 if stream else f.read)(block)  # a pipe: what it has now, its lines used as they come
            found = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + len(buf)
            buf, marks = buf + data, np.concatenate([marks, found])
            if not data and buf and (not len(marks) or marks[-1] != len(buf) - 1):
                marks = np.append(marks, len(buf) - 1)  # the last line has no newline: it ends with the file
            sizes = np.diff(marks, prepend=-1)  # each complete line's length, its newline included
            if (sizes > limit).any() or len(buf) - (marks[-1] + 1 if len(marks) else 0) > limit:
                k = int(np.argmax(sizes > limit)) if (sizes > limit).any() else len(marks)
                raise InputError(
                    f"{path}:{line_no + k}: a line of more than {limit:,} bytes, the limit (is it text? if so, raise "
                    f"{LINE_LIMIT_ENV})"
                )
            while (
                left and len(marks) and (len(marks) >= min(chunk_lines, left) or marks[-1] >= chunk_bytes or not data)
            ):
                fit = max(1, int(np.searchsorted(marks, chunk_bytes)))  # whole lines within the budget, at least one
                take = int(min(chunk_lines, left, len(marks), fit))
                cut = int(marks[take - 1]) + 1
                yield line_no, buf[:cut]
                buf, marks = buf[cut:], marks[take:] - cut
                line_no, left = line_no + take, left - take
            if not data:
                return


def decode_raw(blob: bytes, path: Path, first_line: int, strict: bool) -> tuple[list[str], int]:
    """(lines, how many held invalid UTF-8) of a block of whole lines that starts at line `first_line`, under the
    line limit, their endings (LF or CRLF) dropped. Invalid bytes are replaced with U+FFFD and counted, or raise
    InputError under `strict`. The block is decoded whole: only a faulty block is cut into lines of bytes."""
    if len(blob) > line_limit():
        check_line_lengths(io.BytesIO(blob).readlines(), path, first_line)
    try:
        text, bad = blob.decode("utf-8"), 0
    except UnicodeDecodeError:
        raw = io.BytesIO(blob).readlines()
        if strict:
            for i, line in enumerate(raw):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(
                        f"{path}:{first_line + i}: invalid UTF-8 at byte {e.start} "
                        "(re-encode the file, or drop --strict to replace bad bytes with U+FFFD)"
                    ) from None
        bad = sum(1 for line in raw if not _is_utf8(line))
        text = blob.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if "\r" in text:
        lines = [s[:-1] if s.endswith("\r") else s for s in lines]
    return lines, bad


def check_line_lengths(raw: list[bytes], path: Path, first_line: int) -> None:
    """Refuse a line longer than the limit (16 MiB; PARAPHRASTIC_MAX_LINE_BYTES raises it): a line is held in
    memory whole, and tokenizing one of hundreds of MB takes many GB."""
    limit = line_limit()
    if raw and max(map(len, raw)) > limit:
        k = next(i for i, line in enumerate(raw) if len(line) > limit)
        raise InputError(
            f"{path}:{first_line + k}: a line of more than {limit:,} bytes, the limit (is it text? if so, raise "
            f"{LINE_LIMIT_ENV})"
        )


def line_limit() -> int:
    """The longest line read, in bytes: 16 MiB, or PARAPHRASTIC_MAX_LINE_BYTES (a whole number of 1 or more)."""
    given = os.environ.get(LINE_LIMIT_ENV) or str(DEFAULT_MAX_LINE_BYTES)
    if not given.strip().isdigit() or int(given) < 1:
        raise InputError(
            f"{LINE_LIMIT_ENV}={given}: give the longest line to read in bytes, a whole number of 1 or more"
        )
    return int(given)


def skip_lines(f: BinaryIO, n: int) -> None:
    """Move a binary file past its next `n` lines in 1 MiB blocks, without splitting the skipped text."""
    while n > 0 and (block := f.read(1 << 20)):
        found = block.count(b"\n")
        if found >= n:
            f.seek(-len(block.split(b"\n", n)[-1]), os.SEEK_CUR)
            return
        n -= found


def read_lines(path: str | os.PathLike, strict: bool = False) -> list[str]:
    """All lines of a text file, with iter_line_chunks' UTF-8 policy (`strict`: an error naming the line)."""
    return [line for chunk in iter_line_chunks(path, strict=strict) for line in chunk]


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Turn a failed read of an input (/proc/self/mem, a bad disk, a corrupt .gz) into one error naming the file."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InputError(f"{path}: not a readable gzip file, truncated or corrupt ({e})") from None
    except OSError as e:
        if e.filename is not None:
            raise
        raise InputError(f"{path}: cannot be read ({(e.strerror or str(e)).lower()})") from None


def count_lines(path: str | os.PathLike) -> int:
    """Number of lines in a file (a final line without a newline counts), read in 1 MiB blocks."""
    n, last = 0, b"\n"
    with reading(Path(path)), open_binary(Path(path)) as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def split_pair(line: str, path: Path | str, line_no: int) -> tuple[str, str]:
    """Split `sentence1<TAB>sentence2`; anything but exactly one tab is an InputError."""
    parts = line.split("\t")
    if len(parts) != 2:
        hint = "fix the line, or pass --skip-bad-lines"
        if len(parts) == 3 and is_number(parts[0]):
            hint = ("it looks like an STS file, score<TAB>sentence1<TAB>sentence2: give the pairs alone (cut -f2- FILE), "
                    "or score it against its gold scores with paraphrastic.evaluate.score_sts_file")  # fmt: skip
        raise InputError(f"{path}:{line_no}: expected sentence1<TAB>sentence2, found {len(parts) - 1} tabs ({hint})")
    return parts[0], parts[1]


def is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def parse_pair_lines(
    lines: list[str], path: str, first_line: int, skip_bad: bool
) -> tuple[list[tuple[str, str]], list[int]]:
    """Split a chunk of lines into pairs, one per line; under `skip_bad` a bad line becomes
    (its text, "") and its line number is returned."""
    pairs, bad = [], []
    for i, line in enumerate(lines):
        try:
            pairs.append(split_pair(line, path, first_line + i))
        except InputError:
            if not skip_bad:
                raise
            pairs.append((line.replace("\t", " "), ""))
            bad.append(first_line + i)
    return pairs, bad


def bad_pairs_note(count: int, first: Sequence) -> str:
    """The summary of the lines --skip-bad-lines scored nan: how many, and the first SHOWN (line numbers, or
    FILE:LINE)."""
    head = ", ".join(map(str, first[:SHOWN]))
    return f"{count} bad lines (not exactly one tab) scored nan: line " + (
        head if count <= SHOWN else f"{head}, ... ({count} lines)"
    )


def invalid_utf8_note(count: int) -> str:
    """The warning that `count` lines held invalid UTF-8, read with U+FFFD in its place."""
    return f"warning: {count} lines had invalid UTF-8, replaced by U+FFFD"


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Open a temporary file beside `path`; on success fsync it and rename it to `path`, on any exception remove
    it, `path` keeping its previous content."""
    with atomic_path(path) as tmp, open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
        yield f


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a writer that opens files itself (np.lib.format, h5py); it is fsynced
    and renamed to `path` only if the block finishes without an exception. Those killed writers left go first."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # a device or FIFO (/dev/null, <(...)):
        with reporting_full_disk(path):  # written through, never replaced by a regular file
            yield path
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # write the link's target; the link stays a link
    if path.is_dir():
        raise OutputError(f"{path}: is a folder; give a file name to write")
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    if mode is not None and not os.access(path, os.W_OK):
        raise OutputError(f"{path}: is read-only (mode {mode:o}); make it writable, or write elsewhere")
    remove_stale_temps(path)
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        with reporting_full_disk(path):
            yield Path(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)  # the replaced file's permissions, as editors and rsync keep them
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def flushing(path: Path, every: float = FLUSH_S) -> Iterator[None]:
    """While the block writes `path` (through a memory map, from worker processes too), a thread writes its pages
    to disk every `every` seconds, so that the fsync which publishes it finds little left: otherwise a fast run ends
    waiting on gigabytes (2 GB of rows: 2.9 s of a 20 s run on 2 cores, far more of one on 16)."""
    done = threading.Event()

    def flush() -> None:
        while not done.wait(every):
            with contextlib.suppress(OSError), open(path, "rb") as f:  # a full disk is the writer's error to give
                os.fdatasync(f.fileno())

    thread = threading.Thread(target=flush, name="flushing", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def reporting_full_disk(path: Path, kept: str = "it was left as it was") -> Iterator[None]:
    """Turn a full disk or file size limit while writing `path` into an OutputError naming it, also when
    a library (torch.save) reports it as another error with the OSError as its context."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        cause = _os_error(e)
        if cause is None or cause.errno not in NO_SPACE:
            raise
        reason = os.strerror(cause.errno).lower()
        raise OutputError(f"{path}: {reason} while writing; {kept} (free some space or write elsewhere)") from None


def _os_error(error: BaseException | None) -> OSError | None:
    """The first OSError in an exception's chain of causes and contexts."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


def write_npy_rows(path: str | os.PathLike, row: int, vectors: np.ndarray) -> None:
    """Write `vectors` at rows [row, row + len) of an existing .npy file, in its dtype, with one positioned write
    (worker processes fill one output side by side; a memory map per write costs more in page faults)."""
    with open(path, "rb+") as f:
        _, shape, fortran, dtype = npy_header(f)
        if fortran or len(shape) != 2 or row + len(vectors) > shape[0]:
            raise ValueError(f"{path}: rows {row}..{row + len(vectors)} do not fit its {shape} array")
        write_at(f.fileno(), np.ascontiguousarray(vectors, dtype=dtype), f.tell() + row * shape[1] * dtype.itemsize)


def npy_header(f: BinaryIO) -> tuple[tuple[int, int], tuple, bool, np.dtype]:
    """An open .npy file's format version, shape, Fortran order and type, read from its header, which `f` is left
    just past (at its first row)."""
    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return (version, *header(f))


def set_npy_rows(path: str | os.PathLike, rows: int) -> None:
    """Rewrite an .npy file's header, in place, to say it holds `rows` rows: a stream's count, known at its end.
    numpy pads the first axis of a header to 21 digits, so that the header keeps its length and the rows their place."""
    with open(path, "rb+") as f:
        version, shape, fortran, dtype = npy_header(f)
        end = f.tell()
        f.seek(0)
        write = np.lib.format.write_array_header_1_0 if version == (1, 0) else np.lib.format.write_array_header_2_0
        fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran, "shape": (rows, *shape[1:])}
        write(f, fields)
        if f.tell() != end:
            raise OutputError(
                f"{path}: numpy {np.__version__} would move the rows to resize the header; use numpy 1.24+"
            )


def write_at(fd: int, array: np.ndarray, at: int) -> None:
    """Write a C-contiguous array's bytes at byte `at` of an open file, with one positioned write where it can."""
    data = memoryview(array).cast("B")
    while data:  # a regular file takes it all at once, short of a signal or a full disk
        written = os.pwrite(fd, data, at)
        data, at = data[written:], at + written


def read_at(fd: int, out: memoryview, at: int) -> None:
    """Fill `out`, a writable byte buffer, with an open file's bytes from byte `at`, read straight into it."""
    while out:
        got = os.preadv(fd, [out], at)
        if not got:
            raise OSError(f"the file ended {len(out)} bytes short of what was to be read")
        out, at = out[got:], at + got


def check_room(path: str | os.PathLike, needed: int) -> None:
    """Refuse, before any work, an output of `needed` bytes that its file system has no room for (a file of a
    billion empty lines would otherwise fill the disk for everyone before failing)."""
    folder = Path(path).resolve().parent
    if Path(path).exists() and not Path(path).is_file():  # a device or pipe: written through a scratch file
        folder = Path(tempfile.gettempdir())
    while not folder.exists():  # the output's folder is made later: its nearest existing one decides
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OutputError(
            f"{path}: no space left on device for it: it needs {size_text(needed)}, its file system has "
            f"{size_text(free)} free; nothing was written (free some space or write elsewhere)"
        )


def size_text(n: int) -> str:
    """A byte count for people: 1.5 GiB, 12.0 MiB, 300 KiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{n} bytes"


def reserve_space(path: str | os.PathLike) -> None:
    """Allocate the blocks of a (sparse) file now: a full disk is then an error here, rather than a
    SIGBUS later when a memory map of the file writes to a page the file system cannot provide."""
    with open(path, "rb+") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, max(os.fstat(f.fileno()).st_size, 1))
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise


def remove_stale_temps(path: str | os.PathLike) -> int:
    """Remove the temporary files a killed run of this toolkit left beside `path`: names of exactly the form
    `_temp_beside` makes (`.NAME.PID.XXXXXXXX.tmp`) whose process is gone. Anything else (a user's
    `.NAME.backup.tmp`, a running job's temporary) is kept. Returns how many were removed."""
    path = Path(path)
    stale = glob.glob(os.path.join(glob.escape(str(path.parent)), f".{glob.escape(path.name)}.*.tmp"))
    ours = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[a-z0-9_]{{8}}\.tmp")
    removed = 0
    for tmp in stale:
        mine = ours.fullmatch(Path(tmp).name)
        if mine is None or process_alive(int(mine.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
            removed += 1
    return removed


@contextlib.contextmanager
def scratch_folder(parent: str | os.PathLike, prefix: str) -> Iterator[Path]:
    """A temporary folder `PARENT/PREFIX.PID.*`, removed at the end; the folders of killed runs (their
    process gone) are removed first, so a kill leaks nothing for long."""
    parent = Path(parent)
    for old in left_by_dead(parent, prefix):
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}.{os.getpid()}.", dir=parent) as tmp:
        with reporting_full_disk(Path(tmp), "the scratch folder is removed"):  # a full disk names the folder
            yield Path(tmp)


def left_by_dead(folder: Path, prefix: str) -> Iterator[Path]:
    """The entries `PREFIX.PID.*` of `folder` whose process is gone: what killed runs left there."""
    for old in folder.glob(f"{glob.escape(prefix)}.*"):
        owner = temp_owner(old.name, prefix)
        if owner is not None and not process_alive(owner):
            yield old


def temp_owner(name: str, prefix: str) -> int | None:
    """The process id in a temporary name `PREFIX.PID.*` (None for a name without one)."""
    owner = name[len(prefix) + 1 :].split(".")[0]
    return int(owner) if owner.isdigit() else None


def process_alive(pid: int) -> bool:
    """Whether a process with this id is running on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


class QuietBar:
    """progress's bar under --quiet: it shows nothing, and spares a small command tqdm's import (12 ms of 0.3 s)."""

    def update(self, n: int = 1) -> None:
        pass


@contextlib.contextmanager
def progress(total: int | None, unit: str, quiet: bool = False, **options) -> Iterator:
    """A tqdm bar on stderr that shows after half a second (a quick error comes alone) and is cleared when an error
    ends the block, so that the error line is the last thing printed."""
    if quiet:
        yield QuietBar()
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit=unit, file=sys.stderr, delay=0.5, **options)
    try:
        yield bar
    except BaseException:
        bar.leave = False
        raise
    finally:
        bar.close()


def make_folder(path: Path) -> Path:
    """Make an output folder and its parents; a file of that name is a one-line error saying so (mkdir's own
    error, "File exists", reads as if the folder were in the way)."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: is a file; --output-dir takes a folder")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def lock_folder(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (its `.lock` file) inside the block, and remove the file after it;
    a second process asking for it gets an InputError at once instead of interleaving its work."""
    path = folder / ".lock"
    while True:
        handle = open(path, "ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise InputError(
                f"{folder}: another process is training in this folder; wait for it or use another"
            ) from None
        try:  # the lock counts only on the file the name still holds (its last holder removes it when done)
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        handle.close()


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file next to `path` (same file system, so the rename is atomic), with the
    permissions a plain open() would give under the current umask rather than mkstemp's 0600."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # an output's folder is made (a job array's vectors/)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as e:
        raise OutputError(f"{path}: cannot create a file there ({e.strerror.lower()})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return fd, tmp


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
