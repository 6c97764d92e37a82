"""Exactly-once output folders for jobs that write parts from many workers (the Ray engine), in the manner of
Hadoop's and Spark's output committers: claim the folder, stage, commit work items, publish, manifest last.

    OUT/_claim             the run that owns the folder (held under an exclusive lock while it runs)
    OUT/_temporary/        staging: job.json (what the run is of), items/NNNNNN.json (committed items), parts
                           named part-*.parquet.staged, which no reader's glob of *.parquet reaches
    OUT/part-*.parquet     published parts, moved out of staging only once every item is committed
    OUT/_manifest.parquet  the manifest (inputs, model, options, every part and its rows) in the key-value metadata
                           of a Parquet file of no rows and the parts' columns, so that a folder read adds nothing
    OUT/_SUCCESS           empty, written last: the folder is finished (Hadoop's marker)

A folder is claimed by linking a locked file as `_claim` (an atomic step: of two runs exactly one gets it); the
lock dies with its process, so a later run can tell a running job from a stopped one. A reader trusts a folder
only when `_SUCCESS` is there, and reads exactly the parts the manifest lists. The finished folder holds Parquet
files and one empty file, which DuckDB, polars, pyarrow, pandas and Ray Data read as a folder or a glob; while a
run is unfinished they find no Parquet rows, or refuse (`_claim`). A stopped run is finished by the same command
with --resume: the staged job must be of the same inputs (content hashes), model and options, and only the work
items without a commit record run again.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import shlex
import shutil
import socket
import sys
import uuid
from pathlib import Path

from paraphrastic.fileio import (
    PARTS_FOLDER_NAMES,
    Error,
    InputError,
    OutputError,
    atomic_output,
    file_digest,
    left_by_dead,
)

CLAIM, STAGING, MANIFEST, DONE = PARTS_FOLDER_NAMES  # "_claim", "_temporary", "_manifest.parquet", "_SUCCESS"
STAGED = ".staged"  # a staged part's suffix: part-*.parquet.staged
FORMAT, VERSION = "paraphrastic-parts", 3  # version 3: each part's size and sha256
PART = re.compile(r"part-\d{6}-\d{5}\.parquet")  # a part's name: its item, then its number in the item
SHA256 = re.compile(r"[0-9a-f]{64}")
ATTEMPT = re.compile(rf"\.{CLAIM}\.\d+\.[0-9a-f]+\.tmp")  # `claim`'s temporary: .{CLAIM}.PID.RUN.tmp
KEY = b"paraphrastic"  # the manifest's key in the Parquet metadata


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_json(path: Path, data: dict) -> None:
    """Write a JSON file atomically (a reader sees the old file, or the whole new one)."""
    with atomic_output(path, "w") as f:
        json.dump(data, f, indent=1)


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable ({e}); it is not a file this toolkit wrote whole") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a JSON object; it is not a file this toolkit wrote")
    return data


class Job:
    """An output folder claimed by this process: parts are written into `staging`, each finished work item is
    recorded with `commit`, and `publish` moves the parts out and writes the manifest last."""

    def __init__(self, out: Path, held: tuple, made: bool, spec: dict):
        self.out, (self.handle, self.record, _), self.made, self.spec = out, held, made, spec
        self.staging, self.staged = out / STAGING, False  # staged: the staging area is this run's to remove
        self.stamps: dict[str, list[int]] = {}  # each committed part's stamp (inode and times) when it was checked

    @classmethod
    def open(cls, out: str | os.PathLike, spec: dict, resume: bool = False) -> Job:
        """Claim `out` for a job of `spec` (inputs, model, options, items): a new or empty folder, or with
        `resume` the folder of a stopped job of the same spec. Refusals are one InputError naming the folder."""
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise InputError(f"{out}: is a file; --output-dir takes a folder (new or empty)")
        if resume and (out / DONE).exists():
            said = check_same(out, manifest(out), spec, "finished run")
            clear_finished(out)
            raise Finished(said)
        made = not out.exists()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"{out}: cannot make the folder ({e.strerror.lower()})") from None
        try:
            held = (*take_over(out), True) if resume and (out / CLAIM).exists() else (*claim(out), False)
        except BaseException:
            if made:
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
        job = cls(out, held, made, spec)
        try:
            job.stage(took_over=resume and held[2])
        except BaseException:
            job.release(keep=held[2])
            raise
        return job

    def stage(self, took_over: bool) -> None:
        """Check the folder holds nothing else, then make the staging area, or adopt the staging of the stopped
        run whose claim this run `took_over`."""
        job_file = self.staging / "job.json"
        if took_over and job_file.exists():
            check_same(self.out, read_json(job_file), self.spec, "stopped run")
            self.staged = True
            return
        ours = (CLAIM, STAGING) if took_over else (CLAIM,)
        # another run's attempt at the claim (ATTEMPT) is not content: it fails, since this run holds the claim,
        # and is gone once that run has seen so (two runs started together both gave up over it)
        others = sorted(p.name for p in self.out.iterdir() if p.name not in ours and not ATTEMPT.fullmatch(p.name))
        if (self.out / DONE).exists() or (self.out / MANIFEST).exists():
            raise InputError(f"{self.out}: holds the finished output of an earlier run; give a new --output-dir")
        if others:
            raise InputError(
                f"{self.out}: is not empty ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); "
                "give a new or empty --output-dir"
            )
        self.staged = True
        shutil.rmtree(self.staging, ignore_errors=True)  # that of a run that died before recording its job
        (self.staging / "items").mkdir(parents=True)
        write_json(job_file, self.spec)

    def committed(self) -> dict[int, dict]:
        """The records of the work items already committed (by this run or the stopped one it resumes), each
        checked: a record of an item of this job, naming its own parts, each there (staged, or published by a
        publish that stopped) with the size and sha256 it was written with. A record that fails is removed and
        its item done again."""
        records = {}
        for path in sorted((self.staging / "items").glob("*.json")):
            if not path.is_file():
                continue
            try:
                record = read_json(path)
                item = checked_record(record, len(self.spec["items"]))
                lines = self.spec["items"][item]["lines"]
                if path.name != f"{item:06d}.json" or (lines >= 0 and sum(record["part_rows"]) != lines):
                    raise InputError(f"{path.name}: not the whole record of item {item}")
                for name, size, digest in zip(
                    record["parts"], record["part_bytes"], record["part_sha256"], strict=True
                ):
                    check_part(self.part_path(name), size, digest)
                stamps = {name: stamp(self.part_path(name)) for name in record["parts"]}
            except (InputError, OSError):
                path.unlink(missing_ok=True)  # the item runs again and writes its parts anew
                continue
            self.stamps |= stamps
            records[item] = record
        return records

    def part_path(self, name: str) -> Path:
        """Where a committed part is: staged, or already published by a publish that stopped."""
        staged = self.staging / (name + STAGED)
        return staged if staged.exists() else self.out / name

    def commit(self, record: dict) -> None:
        """Record one finished work item (its parts already renamed into staging): a resumed run skips it. Each
        part's stamp is the writer's, taken as the part was renamed into place (`stamp`), else taken now."""
        written = record.get("part_stamp") or [stamp(self.staging / (name + STAGED)) for name in record["parts"]]
        self.stamps |= dict(zip(record["parts"], written, strict=True))
        write_json(self.staging / "items" / f"{int(record['item']):06d}.json", record)

    def check_staged(self, records: dict[int, dict]) -> None:
        """Before publishing: every committed part is there, the same file, unchanged since it was written or
        checked (its size, inode, modification and change times: any write moves the change time, which no one
        can set back); one that is not loses its item's record (--resume runs it again). This costs a stat a part
        where hashing would cost the driver a read of the whole output; --resume and read_parts hash."""
        for record in records.values():
            for name, size in zip(record["parts"], record["part_bytes"], strict=True):
                path = self.part_path(name)
                if not path.is_file() or path.stat().st_size != size or stamp(path) != self.stamps.get(name):
                    (self.staging / "items" / f"{record['item']:06d}.json").unlink(missing_ok=True)
                    raise Damaged(f"{path}: changed under the run (it is not the part that was written)")

    def publish(self, records: dict[int, dict], totals: dict) -> dict:
        """Move every committed item's parts out of staging, in order, then write the manifest and `_SUCCESS` last;
        a crash in between leaves a folder without `_SUCCESS`, which --resume finishes (a part moved already is
        kept)."""
        parts = []
        for k in sorted(records):
            record = records[k]
            for name, rows, size, digest in zip(record["parts"], record["part_rows"], record["part_bytes"],
                                                record["part_sha256"], strict=True):  # fmt: skip
                if (self.staging / (name + STAGED)).exists():
                    os.replace(self.staging / (name + STAGED), self.out / name)
                parts.append({"name": name, "rows": rows, "bytes": size, "sha256": digest})
        manifest = {"format": FORMAT, "version": VERSION, **self.spec, "run": self.record, "finished": now()}
        manifest |= totals | {"rows": sum(p["rows"] for p in parts), "parts": parts}
        for old in left_by_dead(self.out, f".{CLAIM}"):  # a killed run's claim, never linked (its half-written
            old.unlink(missing_ok=True)  # manifest goes as the atomic write begins)
        write_manifest(self.out, manifest)
        with atomic_output(self.out / DONE, "wb"):
            pass
        self.release(keep=False)  # the staging and the claim go
        return manifest

    def release(self, keep: bool) -> None:
        """Give the folder up: with `keep` the staging and the claim stay (unlocked: --resume takes them over);
        without, everything this run made goes, the folder too if the run made it and it is empty."""
        if not keep:
            if self.staged:
                shutil.rmtree(self.staging, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.out / CLAIM)
            if self.made:
                with contextlib.suppress(OSError):
                    self.out.rmdir()
        self.handle.close()


class Damaged(Error):
    """A staged part that is not the one written: its item is done again by --resume."""


class Finished(Exception):
    """--resume on a folder whose run had finished already, with the same inputs, model and options."""


def run_record() -> dict:
    """Who this run is: an id, the host and process, when it started and its command line."""
    return {"run": uuid.uuid4().hex[:12], "host": socket.gethostname(), "pid": os.getpid(), "started": now(),
            "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])}  # fmt: skip


def claim(out: Path) -> tuple:
    """Claim `out`: a locked file linked as `_claim` (the link fails if another run has it); returns the open
    file, whose lock is this run's hold on the folder until it is closed or the process dies, and the record."""
    record = run_record()
    tmp = out / f".{CLAIM}.{os.getpid()}.{record['run']}.tmp"
    handle = open(tmp, "w+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        json.dump(record, handle)
        handle.flush()
        os.link(tmp, out / CLAIM)
    except FileExistsError:
        handle.close()
        raise InputError(refusal(out)) from None
    except BaseException:
        handle.close()
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return handle, record


def take_over(out: Path) -> tuple:
    """--resume: lock the claim of a stopped run and make it this run's (one that still runs is refused)."""
    handle = open(out / CLAIM, "r+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(out / CLAIM).st_ino != os.fstat(handle.fileno()).st_ino:
            raise BlockingIOError  # the run that held it finished and removed it while we waited
    except (BlockingIOError, FileNotFoundError):
        handle.close()
        raise InputError(refusal(out)) from None
    try:
        old = json.loads(handle.read())
    except ValueError:
        old = {}
    record = run_record()
    if isinstance(old, dict) and isinstance(old.get("command"), str):
        record["command"] = old["command"]  # the job's first command line: the one a later --resume repeats
    handle.seek(0)
    handle.truncate()
    json.dump(record, handle)
    handle.flush()
    return handle, record


def clear_finished(out: Path) -> None:
    """Remove the claim and staging that a run killed between writing its manifest and its clean-up left in
    `out` (a run that still holds its claim removes them itself)."""
    if not (out / CLAIM).exists():
        return
    try:
        handle, _ = take_over(out)
    except InputError:  # held: the run lives, and is about to remove them
        return
    with handle:
        shutil.rmtree(out / STAGING, ignore_errors=True)
        os.unlink(out / CLAIM)


def running(out: Path) -> bool:
    """Whether the run that claimed `out` holds its lock still (is alive)."""
    try:
        with open(out / CLAIM, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False
    return False


def refusal(out: Path) -> str:
    """Why `out` cannot be claimed: in use by a running job, or holding a stopped one to resume."""
    try:
        record = json.loads((out / CLAIM).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    record = record if isinstance(record, dict) else {}
    who = f"run {record.get('run', '?')} (pid {record.get('pid', '?')} on {record.get('host', '?')}, since " \
          f"{record.get('started', '?')})"  # fmt: skip
    if running(out):
        return f"{out}: in use by {who}: `{record.get('command', '?')}`; wait for it or give another --output-dir"
    try:
        items = len(read_json(out / STAGING / "job.json")["items"])
        done = f" ({len(list((out / STAGING / 'items').glob('*.json')))} of {items} work items committed)"
    except (InputError, KeyError, TypeError):
        done = ""
    return (
        f"{out}: holds the unfinished work of {who}{done}, which stopped; finish it with: "
        f"{resume_command(record.get('command', 'the same command'))} (or give another --output-dir)"
    )


def resume_command(command: str) -> str:
    """The command line that finishes a stopped run of `command`."""
    return command if " --resume" in f" {command}" else f"{command} --resume"


def check_same(out: Path, staged: dict, spec: dict, what: str) -> str:
    """Refuse to resume a staged or finished job of other inputs, model or options; returns a line saying what
    the folder holds."""
    for key, name in (("kind", "command"), ("inputs", "inputs"), ("model", "model"), ("options", "options"),
                      ("items", "work items (another version of the toolkit)")):  # fmt: skip
        if staged.get(key) != spec.get(key):
            differ = ""
            if key == "inputs":
                old = {i["path"]: i for i in staged.get("inputs") or []}
                new = {i["path"]: i for i in spec["inputs"]}
                changed = [p for p in new if p in old and old[p] != new[p]]
                differ = f" ({changed[0]} changed since)" if changed else " (other files)"
            raise InputError(
                f"{out}: its {what} was of other {name}{differ}; --resume finishes a run of the same inputs, model "
                "and options (give a new --output-dir for this one)"
            )
    rows = staged.get("rows")
    return f"{out}: finished already ({rows} rows); nothing to do" if rows is not None else ""


def write_manifest(out: Path, data: dict) -> None:
    """The manifest as the metadata of a Parquet file of no rows, with the columns of the first part (a file and a
    line column where there is none), so that every reader of the folder adds no row and no column from it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = out / data["parts"][0]["name"] if data["parts"] else None
    schema = pq.read_schema(first) if first else pa.schema([("file", pa.large_string()), ("line", pa.int64())])
    table = schema.with_metadata({KEY: json.dumps(data).encode()}).empty_table()
    with atomic_output(out / MANIFEST, "wb") as f:
        pq.write_table(table, f)


def read_manifest(path: Path) -> dict:
    """The manifest kept in a Parquet file's metadata, or one InputError saying what is wrong with the file."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
        data = json.loads(metadata[KEY])
    except Exception as e:  # pyarrow's errors for a damaged file, KeyError, JSON's
        raise InputError(f"{path}: not a manifest this toolkit wrote whole ({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("parts"), list):
        raise InputError(f"{path}: not a manifest of paraphrastic's parts")
    if data.get("version") != VERSION:
        raise InputError(f"{path}: a manifest of version {data.get('version')!r:.20}; this toolkit reads version "
                         f"{VERSION} (its parts' checksums): run the job again")  # fmt: skip
    order = []
    for part in data["parts"]:
        fields = isinstance(part, dict) and PART.fullmatch(str(part.get("name"))) and is_count(part.get("rows"))
        if not fields or not is_count(part.get("bytes")) or not SHA256.fullmatch(str(part.get("sha256"))):
            raise InputError(f"{path}: a part entry that is not one this toolkit writes ({str(part)[:80]})")
        order.append(part["name"])
    if (
        order != sorted(set(order))
        or not is_count(data.get("rows"))
        or data["rows"] != sum(p["rows"] for p in data["parts"])
    ):
        raise InputError(f"{path}: its parts are out of order, repeated, or do not add up to its rows")
    return data


def is_count(value) -> bool:
    return type(value) is int and value >= 0


def part_name(item: int, part: int) -> str:
    """The name of a work item's part: part-ITEM-PART.parquet, both zero-padded, so that names sort in line order."""
    return f"part-{item:06d}-{part:05d}.parquet"


def parts_glob(item: int | None = None) -> str:
    """A glob of the names part_name gives one work item's parts (every item's: None)."""
    return "part-*.parquet" if item is None else f"part-{item:06d}-*.parquet"


def checked_record(record: dict, items: int) -> int:
    """A commit record's item number, once the record is found to be one this toolkit writes: an item of the job,
    its parts named part-ITEM-PART.parquet in order (a plain name in the folder, never a path), each with its
    rows, size and sha256; an InputError otherwise."""
    item = record.get("item")
    if type(item) is not int or not 0 <= item < items:
        raise InputError(f"item {item!r:.20} is not a work item of the job")
    parts = record.get("parts")
    lists = [record.get(k) for k in ("part_rows", "part_bytes", "part_sha256")]
    if not isinstance(parts, list) or not all(isinstance(x, list) and len(x) == len(parts) for x in lists):
        raise InputError(f"item {item}: its record does not list its parts whole")
    names = [part_name(item, k) for k in range(len(parts))]
    counts = all(is_count(x) for x in lists[0] + lists[1])
    if parts != names or not counts or not all(SHA256.fullmatch(str(x)) for x in lists[2]):
        raise InputError(f"item {item}: its record names parts that are not its own")
    return item


def stamp(path: Path) -> list[int]:
    """A file's inode, modification and change times (ns): a write moves the change time, a rename too. Taking it
    also marks the change time as seen, so that on Linux 6.13 or later the next write moves it by at least a
    nanosecond (multigrain timestamps); an older kernel moves it by a clock tick (a few ms), and a write within
    the same tick as the stamp goes unseen here (--resume and read_parts still hash the part)."""
    st = path.stat()
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def check_part(path: Path, size: int, digest: str) -> None:
    """Refuse a part whose size or sha256 is not the one recorded when it was written."""
    try:
        if path.stat().st_size != size or file_digest(path) != digest:
            raise InputError(f"{path}: not the part that was written (damaged or replaced)")
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror or e})") from None


def manifest(folder: str | os.PathLike) -> dict:
    """The manifest of a finished output folder, or one InputError saying what is missing and why."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder")
    if not (folder / DONE).exists():
        if (folder / CLAIM).exists() or (folder / STAGING).exists() or (folder / MANIFEST).exists():
            raise InputError(f"{folder}: has no {DONE}: its run has not finished. {refusal(folder)}")
        raise InputError(f"{folder}: has no {DONE}: not a finished output of --engine ray")
    data = read_manifest(folder / MANIFEST)
    missing = [p["name"] for p in data["parts"] if not (folder / p["name"]).is_file()]
    if missing:
        raise InputError(f"{folder}: {len(missing)} parts its manifest lists are missing ({missing[0]}, ...)")
    for part in data["parts"]:
        if (folder / part["name"]).stat().st_size != part["bytes"]:
            raise InputError(f"{folder / part['name']}: not the part its manifest lists (its size differs); "
                             "the folder was changed after its run finished")  # fmt: skip
    return data
