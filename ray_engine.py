"""Embedding, scoring and bitext mining past one machine, on Ray (`pip install "paraphrastic[ray]"`): --engine ray.

The input files are cut into work items (a plain text file at every LINES_PER_ITEM lines, found by one pass of
newline counting; a Parquet file into runs of whole row groups of at least as many rows; a .gz file whole). A pool
of Ray actors, each holding the model loaded once and running on one thread, reads its items with the toolkit's
own reader (invalid UTF-8 replaced, the line limit) and writes their rows as Parquet parts named by item and part
number. The output folder follows the commit protocol of commit.py: claimed by one run, parts staged, each
finished item committed by the driver, everything published with a manifest written last; a stopped run is
finished with --resume. Rows carry `file` (the input's path as given) and `line` (0-based); the driver holds only
the plan and the items' records, never the vectors. Without an --address, a local Ray starts on this machine's
cores and is shut down when the command ends.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import glob
import json
import logging
import os
import resource
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from paraphrastic import commit, load_encoder
from paraphrastic.blocks import line_offsets
from paraphrastic.cli import Terminated
from paraphrastic.fileio import (
    JOB_BYTES,
    SHOWN,
    Error,
    InputError,
    ModelError,
    bad_pairs_note,
    decode_raw,
    file_digest,
    install_hint,
    invalid_utf8_note,
    iter_line_blocks,
    open_input,
    parse_pair_lines,
    parts_folder_of,
)
from paraphrastic.precision import check_truncate_dim, rows_as
from paraphrastic.static import model_path, use_torch_for
from paraphrastic.workers import use_threads

LINES_PER_ITEM = 262_144  # lines of a plain text file in one work item
PART_LINES = 65_536  # rows of one Parquet part
IN_FLIGHT = 2  # work items queued at each actor: one running, one ready
STALL_S, STALL_TIMES = 20.0, 10  # an actor silent for max(STALL_S, STALL_TIMES x an item's median time) is lost
PART_OPTIONS = {"compression": "uncompressed", "statistics": True}  # write_part's, for polars' writer
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CONNECT_TIMEOUT_S = 10.0  # how long --address may take to answer
PROBE_TIMEOUT_S = 5.0  # how long it may take to answer as Ray does
_joined = True  # whether the Ray in use is one this process joined (or was given), not one it started
_watcher: tuple[int, int] | None = None  # (process id, pipe) of the watcher of the local Ray this process started


def ray_module(local: bool = False):
    """The ray package, or one clear error naming the extra that brings it. `local`: for a Ray of this machine
    alone, kept on loopback (Ray's switch for single-machine Ray, read when it is imported; without it a local
    Ray serves on the machine's network address)."""
    if local:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise InputError(f"--engine ray needs Ray: {install_hint('ray')}") from None
    return ray


def start(address: str | None = None, cpus: int | None = None) -> int:
    """Join the Ray cluster at `address`, or start a local one on this machine's cores, quietly (Ray's own
    warnings and logs off unless RAY_LOG_LEVEL is set); returns its CPUs."""
    global _joined
    ray = ray_module(local=not address)
    if not ray.is_initialized():
        _joined = bool(address)
        quiet = {"log_to_driver": False, "logging_level": os.environ.get("RAY_LOG_LEVEL", logging.ERROR)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the token-authentication and accelerator notices
            if address:
                check_reachable(address)
                ray.init(address=address, **quiet)
            else:
                start_local(ray, cpus or len(os.sched_getaffinity(0)), quiet)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


MIN_ADDRESS_SPACE = 16 << 30  # Ray's processes each map several GB of address space (an actor: 8.4 GB here)


def start_local(ray, cpus: int, options: dict) -> None:
    """Start a local Ray, watched by a forked process that ends its processes if this one dies without stopping
    it: a SIGKILL skips every handler, and Ray's agents outlive their raylet (found parented to init). Under an
    address-space limit too small for Ray's processes (`ulimit -v`, `prlimit --as`), refused at once: its actors
    died and the driver waited inside ray.init."""
    global _watcher
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY and limit < MIN_ADDRESS_SPACE:
        raise InputError(f"--engine ray: this process may map {limit / 2**30:.1f} GiB (ulimit -v); Ray's processes "
                         f"need at least {MIN_ADDRESS_SPACE >> 30} GiB each: lift the limit, or leave --engine ray "
                         "out")  # fmt: skip
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        watch(read)
    os.close(read)
    _watcher = pid, write
    try:
        ray.init(num_cpus=cpus, include_dashboard=False, **options)
    finally:
        import psutil  # Ray's own dependency

        started = [(p.pid, p.create_time()) for p in psutil.Process().children(recursive=True) if p.pid != pid]
        os.write(write, json.dumps(started).encode() + b"\n")


def watch(pipe: int) -> None:
    """The watcher's life: wait for the end of the pipe from the command (its exit, or its death), then kill the
    Ray processes it listed and any its raylet started since, that outlived Ray's shutdown or the command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and a group's SIGTERM are the command's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.closerange(3, pipe)  # the command's files (its lock on the output folder) are not the watcher's to hold
    os.closerange(pipe + 1, os.sysconf("SC_OPEN_MAX"))
    data = b""
    while chunk := os.read(pipe, 1 << 16):
        data += chunk
    with contextlib.suppress(Exception):
        import psutil

        listed = json.loads(data.split(b"\n")[0] or b"[]")
        raylets = {f"RAY_RAYLET_PID={pid}".encode() for pid, _ in listed}
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                env = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
                if [proc.pid, proc.create_time()] in listed or raylets.intersection(env):
                    proc.kill()
    os._exit(0)


def check_reachable(address: str) -> None:
    """Refuse, within CONNECT_TIMEOUT_S, an --address HOST:PORT where nothing answers (Ray itself retries for
    minutes without a word)."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S) as probe:
            grpc = speaks_grpc(probe)
    except ValueError:
        raise InputError(f"--address {address}: expected HOST:PORT (the head node's, e.g. 10.0.0.1:6379)") from None
    except OSError as e:
        raise InputError(
            f"--address {address}: no Ray cluster answers there ({e.strerror or 'timed out'}); start one with "
            "`ray start --head`, or leave --address out for a local Ray"
        ) from None
    if not grpc:
        raise InputError(f"--address {address}: something answers there, but not Ray (its head node speaks gRPC); "
                         "give the head node's address (`ray start --head` prints it)")  # fmt: skip


def speaks_grpc(probe: socket.socket) -> bool:
    """Whether the server at the other end answers an HTTP/2 greeting with its settings, as Ray's head node (a gRPC
    server) does within milliseconds; another server answers otherwise, or not at all (Ray would wait minutes)."""
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # preface, SETTINGS
        head = b""
        while len(head) < 9 and (chunk := probe.recv(9 - len(head))):
            head += chunk
    except OSError:
        return False
    return len(head) == 9 and head[3] == 4  # a SETTINGS frame


def stop() -> None:
    """Shut down the Ray this run started (leaving a cluster it joined), now rather than at exit, where Ray
    first waits half a second for its log lines."""
    global _watcher
    ray = ray_module()
    if ray.is_initialized() and not _joined:
        ray.shutdown()
    if _watcher is not None:
        pid, pipe = _watcher
        _watcher = None
        os.close(pipe)  # the watcher sweeps what outlived the shutdown
        os.waitpid(pid, 0)


def input_files(patterns: list[str], text_column: str | None = None) -> list[Path]:
    """The files the --input patterns name (globs sorted, folders they match left out; a plain path as is), each
    file once however many names reach it, each checked readable; Parquet inputs must hold `text_column` and
    must not be parts of one of our output folders."""
    files, seen = [], set()
    for pattern in patterns:
        glob_ = glob.has_magic(pattern) and not os.path.lexists(pattern)  # a file named `[x].txt` is that file
        found = [f for f in sorted(glob.glob(pattern)) if not os.path.isdir(f)] if glob_ else [pattern]
        if not found:
            raise InputError(f"{pattern}: no file matches")
        for name in found:
            if os.path.isdir(name):
                raise InputError(f"{name}: is a folder; --input takes files or globs ('{name}/*.txt')")
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(f"{name.encode('utf-8', 'surrogateescape')!r}: a file name that is not UTF-8, "
                                 "which Ray cannot pass to its workers; rename the file") from None  # fmt: skip
            key = os.path.realpath(name)
            if key not in seen:
                seen.add(key)
                files.append(Path(name))
    for path in files:
        if open_input(path) == 0:
            with open(path, "rb") as f:
                if f.read(1):  # a /proc or /sys file: its size, which the work items are cut by, is not its length
                    raise InputError(f"{path}: its size is not known before it is read (a /proc or /sys file); "
                                     "copy it to a regular file")  # fmt: skip
        if path.suffix == ".parquet":
            check_parquet(path, text_column)
    return files


def check_parquet(path: Path, text_column: str | None) -> None:
    """A Parquet input is text: not a part of our output, and with the text column (read from its footer)."""
    ours = parts_folder_of(path.resolve())
    if ours is not None:
        raise InputError(f"{path}: a part of the output folder {ours}, not text; leave it out of --input")
    import pyarrow.parquet as pq

    try:
        names = pq.ParquetFile(path).schema_arrow.names
    except Exception as e:  # pyarrow's errors for a damaged footer
        raise InputError(f"{path}: not a readable Parquet file ({e})") from None
    if text_column is None:
        raise InputError(f"{path}: Parquet input is for embedding; give pairs as s1<TAB>s2 text files")
    if text_column not in names:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise InputError(
            f"{path}: no column '{text_column}' (it has: {shown}); name the text column with --text-column"
        )


def plan(files: list[Path], lines_per_item: int = LINES_PER_ITEM) -> list[dict]:
    """The work items: (file as named, its absolute path, its position, item number, first line, offset: the byte
    offset of its first line, or for Parquet its first row group, lines; -1 lines: to the end; the file's size and
    modification time, which its reader checks). A .gz file is one item (it cannot be seeked into); a plain file
    is cut at every `lines_per_item` lines, a Parquet file into runs of whole row groups of at least as many."""
    items = []
    for position, path in enumerate(files):
        stat = path.stat()
        if path.suffix == ".gz":
            starts, total = [(0, 0)], -1
        elif path.suffix == ".parquet":
            starts, total = row_group_starts(path, lines_per_item)
        else:
            starts, total = line_offsets(path, lines_per_item)
        for k, (line, offset) in enumerate(starts):
            end = starts[k + 1][0] if k + 1 < len(starts) else total
            items.append({"file": str(path), "path": os.path.abspath(path), "position": position, "item": len(items),
                          "first": line, "offset": offset, "lines": end - line if end >= 0 else -1,
                          "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})  # fmt: skip
    return items


def row_group_starts(path: Path, rows_per_item: int) -> tuple[list[tuple[int, int]], int]:
    """([(first row, first row group)] of each item, all rows) of a Parquet file, from its footer: whole row groups,
    consecutive ones together until they hold `rows_per_item` rows, so that one large file is many items."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    starts, rows = [(0, 0)], 0
    for group in range(meta.num_row_groups):
        if rows - starts[-1][0] >= rows_per_item:
            starts.append((rows, group))
        rows += meta.row_group(group).num_rows
    return starts, rows


class InputChanged(Error):
    """An input that changed under the run: its rows would mix two contents. What is committed stays (it is of
    the content the run began with): restored, the file lets --resume finish; changed, it needs a new run."""


def check_unchanged(item: dict) -> None:
    """Refuse an item's input whose size or modification time is no longer what they were when the run planned
    it (a worker checks before and after reading its item)."""
    stat = os.stat(item["path"])
    if (stat.st_size, stat.st_mtime_ns) != (item["size"], item["mtime_ns"]):
        raise InputChanged(f"{item['file']}: changed during the run ({item['size']:,} bytes when it began, "
                           f"{stat.st_size:,} now)")  # fmt: skip


def read_items(item: dict, text_column: str, strict: bool) -> Iterator[tuple[int, list[str], int]]:
    """(first line, 0-based, the lines, how many held invalid UTF-8) of one work item, PART_LINES lines and about
    JOB_BYTES bytes at a time (read by its absolute path: a worker's folder is not the driver's)."""
    path = Path(item["path"])
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        first, table = item["first"], pq.ParquetFile(path)
        groups, held = [], 0
        while held < item["lines"]:  # the item's row groups, from its first
            groups.append(item["offset"] + len(groups))
            held += table.metadata.row_group(groups[-1]).num_rows
        if not groups:  # no rows
            return
        size = sum(table.metadata.row_group(k).total_byte_size for k in groups)
        rows = max(1, min(PART_LINES, JOB_BYTES * held // max(size, 1)))  # bytes bound a batch
        for batch in table.iter_batches(batch_size=rows, row_groups=groups, columns=[text_column]):
            lines = ["" if t is None else str(t) for t in batch.column(0).to_pylist()]
            yield first, lines, 0
            first += len(lines)
        return
    stop = None if item["lines"] < 0 else item["first"] + item["lines"]
    offset = item["offset"] if path.suffix != ".gz" else None
    for number, blob in iter_line_blocks(path, PART_LINES, item["first"], stop, offset=offset):
        lines, invalid = decode_raw(blob, path, number, strict)
        yield number - 1, lines, invalid


def actor_model(model: str | None, share: int = 0, writes: bool = False):
    """The model of a Ray actor, loaded once: on one thread (Ray gives every actor one CPU), with torch's pooling
    kernel from the start when its `share` of the texts repays the import (the local workers' rule; with a share
    unknown it switches once it has pooled that many), its start-up objects frozen out of the garbage collections
    (they live as long as the actor); one that `writes` parts is warmed up and imports its writers as it starts."""
    use_threads(1)
    use_torch_for(share)
    encoder = load_encoder(model)
    if writes:  # so that its first item's time (the stall clock's) holds none of it
        encoder.warm_up()
        os.environ.setdefault("POLARS_MAX_THREADS", "1")  # polars writes the parts, on one thread too
        import polars  # noqa: F401
        import pyarrow  # noqa: F401
    gc.freeze()
    return encoder


class Parts:
    """A Ray actor: the model, loaded once, turning work items into Parquet parts in the staging folder `out`
    (embedding, or scoring with `score`); `run_item` returns the item's record."""

    def __init__(self, model: str | None, out: str, batch_size: int = 8192, strict: bool = False,
                 score: bool = False, skip_bad: bool = False, text_column: str = "text", share: int = 0,
                 dtype: str = "float32", normalize: bool = False, truncate_dim: int | None = None):  # fmt: skip
        self.model, self.out = actor_model(model, share * (2 if score else 1), writes=True), Path(out)
        self.batch_size, self.strict, self.score, self.skip_bad = batch_size, strict, score, skip_bad
        self.text_column = text_column
        self.finish = functools.partial(rows_as, normalize=normalize, precision=dtype, dims=truncate_dim)

    def run_item(self, item: dict) -> dict:
        """One work item: its record (parts and their rows, bad and invalid lines), or its error (bad input,
        returned as data so that the driver can say it in one line)."""
        try:
            return self.work(item) | {"error": ""}
        except Error as e:
            return {"item": int(item["item"]), "error": f"{type(e).__name__}:{e}"}

    def work(self, item: dict) -> dict:
        record = {"item": int(item["item"]), "file": item["file"], "parts": [], "part_rows": [], "part_bytes": [],
                  "part_sha256": [], "part_stamp": [], "bad_lines": 0, "shown_bad": [], "invalid_utf8_lines": 0}  # fmt: skip
        check_unchanged(item)
        for first, lines, invalid in read_items(item, self.text_column, self.strict):
            if self.score:
                pairs, bad = parse_pair_lines(lines, item["file"], first + 1, self.skip_bad)
                table = self.scores(item["file"], first, pairs)
                record["bad_lines"] += len(bad)
                record["shown_bad"] += bad[: SHOWN - len(record["shown_bad"])]
            else:
                table = self.vectors(item["file"], first, lines)
            name = commit.part_name(int(item["item"]), len(record["parts"]))
            size, digest = write_part(self.out / (name + commit.STAGED), table)
            record["part_stamp"].append(commit.stamp(self.out / (name + commit.STAGED)))  # as written, renamed
            record["parts"].append(name)
            record["part_rows"].append(len(lines))
            record["part_bytes"].append(size)
            record["part_sha256"].append(digest)
            record["invalid_utf8_lines"] += invalid
        check_unchanged(item)  # read whole, and of one content
        return record

    def vectors(self, file: str, first: int, lines: list[str]):
        import pyarrow as pa

        vectors = self.model.embed_here(lines, self.batch_size, finish=self.finish)
        column = pa.FixedSizeListArray.from_arrays(numeric(vectors.reshape(-1)), vectors.shape[1])
        return keyed(file, first, len(lines)).append_column("vector", column)

    def scores(self, file: str, first: int, pairs: list[tuple[str, str]]):
        scores = np.array(self.model.score_raw_text(pairs, self.batch_size), dtype=np.float64)
        return keyed(file, first, len(pairs)).append_column("score", numeric(scores))


def keyed(file: str, first: int, count: int):
    """The key columns of `count` rows from line `first` (0-based) of `file`."""
    import pyarrow as pa

    name = file.encode()
    offsets = np.arange(count + 1, dtype=np.int64) * len(name)
    kind = pa.string() if offsets[-1] < 2**31 else pa.large_string()  # int32 offsets, as pa.array gave, where they fit
    offsets = offsets.astype(np.int32) if kind == pa.string() else offsets
    files = pa.Array.from_buffers(kind, count, [None, pa.py_buffer(offsets), pa.py_buffer(name * count)])
    return pa.Table.from_arrays([files, numeric(np.arange(first, first + count))], ["file", "line"])


def numeric(values: np.ndarray):
    """A 1-d numpy array as an Arrow array over the same bytes. pa.array would import pandas to ask whether the
    values are a pandas object: a second or more of each actor's first item, which the stall clock counted."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def write_part(path: Path, table) -> tuple[int, str]:
    """Write one Parquet part under a temporary name, then rename it (a retried task writes the same name: the part
    is whole, once); returns its size and sha256, taken from the file before the rename, kept by its commit record
    and the manifest for --resume and read_parts. By polars, to the path itself (pyarrow's writer walks a
    fixed-size list value by value: 2.2x the CPU; a Python file object between them: more waiting)."""
    import polars as pl

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pl.from_arrow(table).write_parquet(tmp, **PART_OPTIONS)
        size, digest = tmp.stat().st_size, file_digest(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half part behind
        raise
    return size, digest


def run(items: list[dict], out: Path, workers: int, actor: type | None = None,
        on_done: Callable[[dict], None] | None = None, **parts) -> dict:  # fmt: skip
    """Run the work items on `workers` actors (`actor`, Parts by default, made with **parts), IN_FLIGHT queued at
    each (one while the items left are no more than the actors without one), .gz items first (one a file, however
    long: a run should not end on one), the next item to the first actor done; `on_done` gets each record. A lost
    actor (its process or node gone, or silent for STALL_TIMES an item's median time) is replaced wherever the
    cluster has a CPU, and its items go to the next actor free; after a bad item no later item starts, and the
    first bad one in input order is raised. Plain actors, not Ray Data, whose executor takes seconds to start."""
    ray = ray_module()
    if not items:
        return {}
    remote = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(actor or Parts)
    queue = sorted(items, key=lambda i: (i["lines"] < 0, -i["item"]))  # popped from the end: whole files first
    running, done, failed, hired, lost = {}, {}, None, [], set()
    heard, times, written = {}, [], {}  # each actor's last sign of life; seconds between its items; parts seen
    team: list = []  # the actors that have loaded the model and are not lost
    known = sum(i["lines"] for i in items if i["lines"] > 0)  # a .gz item's lines are not counted
    parts.setdefault("share", known // min(workers, len(items)))

    def hire() -> None:  # a new actor; it gets its items once it has loaded the model
        hired.append(remote.remote(out=str(out), **parts))
        running[hired[-1].__ray_ready__.remote()] = hired[-1], None

    def fill() -> None:  # items to every actor of the team with fewer than IN_FLIGHT: the next to the first free
        load = collections.Counter(member for member, item in running.values() if item is not None)
        for member in team:
            while queue and load[member] < IN_FLIGHT:
                idle = sum(1 for m in hired if m not in lost and not load[m])  # ready or still loading the model
                if load[member] and len(queue) <= idle:  # a queued item would keep one of them waiting
                    break
                item = queue.pop()
                running[member.run_item.remote(item)] = member, item
                load[member] += 1

    for _ in range(min(workers, len(items))):
        hire()
    with signals_noted() as signals:
        try:
            while queue or any(item is not None for _, item in running.values()):
                ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                if signals:
                    raise Stopped("interrupted", 128 + signals[0])
                silent(running, heard, times, lost, out, written)
                if not ready:
                    continue
                member, item = running.pop(ready[0])
                try:
                    record = ray.get(ready[0])
                except ray.exceptions.RayActorError:
                    if item is not None:
                        queue.append(item)  # run again, next
                    if member not in lost:
                        lost.add(member)
                        team[:] = [m for m in team if m != member]
                        if len(lost) > 4 * workers:
                            raise
                        hire()
                    fill()
                    continue
                now = time.monotonic()
                if item is None:
                    heard[member] = now
                    team.append(member)
                    fill()
                    continue
                times.append(now - heard.get(member, now))
                heard[member] = now
                if record["error"]:
                    failed = min(failed or record, record, key=lambda r: r["item"])
                    queue = [i for i in queue if i["item"] < failed["item"]]
                else:
                    done[record["item"]] = record
                    if on_done:
                        on_done(record)
                fill()
        finally:
            for member in hired:
                ray.kill(member)
    if failed:  # the first bad input, in input order, as the local commands say it
        kind, _, message = failed["error"].partition(":")
        raise {"ModelError": ModelError, "InputChanged": InputChanged}.get(kind, InputError)(message)
    return done


def silent(running: dict, heard: dict, times: list[float], lost: set, out: Path, written: dict) -> None:
    """Kill the actors silent for longer than a stall (their items run again elsewhere): Ray may take minutes to
    notice a lost node, and never a hung process. One that staged a part since last heard from is busy, not lost
    (a long .gz item; `written`: the newest part stamp seen of each item)."""
    if not times:
        return
    ray = ray_module()
    limit = max(STALL_S, STALL_TIMES * float(np.median(times)))
    now = time.monotonic()
    for member in {m for m, item in running.values() if item is not None and m not in lost}:
        if now - heard.get(member, now) > limit:
            heard[member] = now  # once a stall
            if not any(wrote_since(item, out, written) for m, item in running.values() if m == member and item):
                ray.kill(member, no_restart=True)


def wrote_since(item: dict, out: Path, written: dict) -> bool:
    """Whether a part of `item` has been written since the last call (its newest modification time moved)."""
    newest = 0
    for path in out.glob(commit.parts_glob(int(item["item"])) + commit.STAGED):
        with contextlib.suppress(FileNotFoundError):  # committed or removed meanwhile
            newest = max(newest, path.stat().st_mtime_ns)
    moved, written[item["item"]] = newest > written.get(item["item"], 0), newest
    return moved


def read_parts(folder: str | os.PathLike, columns: list[str] | None = None, verify: bool = True):
    """The rows of a finished --output-dir as one pyarrow Table in input order: exactly the parts its manifest
    lists, in its order, each of the size and (with `verify`, about a second a GB) the sha256 it was written with,
    their row count checked; a folder without the manifest (a run not finished, killed or still running), or whose
    parts are not those the manifest lists, is refused with one InputError naming what is wrong."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    manifest = commit.manifest(folder)
    paths = [folder / part["name"] for part in manifest["parts"]]
    if verify:
        for path, part in zip(paths, manifest["parts"], strict=True):
            commit.check_part(path, part["bytes"], part["sha256"])
    if not paths:  # a job of no lines: its columns, no rows
        schema = pq.read_schema(folder / commit.MANIFEST).remove_metadata()
        return schema.empty_table().select(columns) if columns else schema.empty_table()
    table = pq.read_table(paths, columns=columns) if len(paths) > 1 else pq.read_table(paths[0], columns=columns)
    if len(table) != manifest["rows"]:
        raise InputError(f"{folder}: {len(table)} rows in its parts, its manifest says {manifest['rows']}")
    return table


def embed_dataset(ds, model: str | None = None, column: str = "text", batch_size: int = 8192, workers: int = 1,
                  normalize_embeddings: bool = False, truncate_dim: int | None = None, precision: str = "float32"):  # fmt: skip
    """A Ray Dataset with a `vector` column added: the embedding of each row's `column`, computed by `workers`
    actors that load the model once each (the Ray Data stage, for pipelines of one's own). `normalize_embeddings`,
    `truncate_dim` and `precision` (float32, binary or ubinary: each row decides alone) as encode makes them."""
    if precision not in ("float32", "binary", "ubinary"):
        raise ValueError(f"precision {precision!r}: the stage embeds batch by batch, so float32, binary or ubinary "
                         "(int8 steps need every row: encode the vectors' column together with precision.scaled_bytes)")  # fmt: skip
    finish = functools.partial(rows_as, normalize=normalize_embeddings, precision=precision, dims=truncate_dim)
    return ds.map_batches(
        Batches, fn_constructor_kwargs={"model": model, "column": column, "finish": finish}, batch_size=batch_size,
        batch_format="numpy", compute=ray_module().data.ActorPoolStrategy(size=workers), num_cpus=1,
    )  # fmt: skip


class Batches:
    """A Ray actor for embed_dataset: the model, loaded once; a `vector` column for each batch."""

    def __init__(self, model: str | None, column: str, finish: Callable):
        self.model, self.column, self.finish = actor_model(model), column, finish

    def __call__(self, batch: dict) -> dict:
        batch["vector"] = self.model.embed_here([str(t) for t in batch[self.column]], finish=self.finish)
        return batch


def part_vectors(folder: Path, item: int | None = None) -> np.ndarray:
    """The vectors of one work item's staged parts (or of all of them) in a folder, in line order, (rows, dim) in the
    parts' type (float32 where paraphrastic-mine wrote them)."""
    import pyarrow.parquet as pq

    paths = sorted(folder.glob(commit.parts_glob(item) + commit.STAGED))
    tables = [pq.read_table(path, columns=["vector"]).column("vector").combine_chunks() for path in paths]
    if not tables:
        return np.zeros((0, 0), np.float32)
    dim = tables[0].type.list_size
    return np.concatenate([t.flatten().to_numpy().reshape(-1, dim) for t in tables])


def index_task(folder: str, rows: np.ndarray, build: Callable):
    """A Ray task: `build(vectors, rows)` over the vectors of a folder's parts (the key side of a search)."""
    return build(part_vectors(Path(folder)), rows)


def search_task(index, folder: str, item: dict, rows: np.ndarray, k: int, search: Callable):
    """A Ray task: (position of the item's first mined row, cosines, key positions) of the k nearest keys of each
    mined row (`rows`: line numbers) in one work item, by `search(index, vectors, k)`."""
    vectors = part_vectors(Path(folder), int(item["item"]))
    lo, hi = np.searchsorted(rows, [item["first"], item["first"] + len(vectors)])
    if hi <= lo:
        return int(lo), np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    return int(lo), *search(index, vectors[rows[lo:hi] - item["first"]], k)


def nearest(keys: tuple[str, np.ndarray], queries: tuple[str, list[dict], np.ndarray], k: int, build: Callable,
            search: Callable) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The k nearest keys of every mined query row, on Ray: the keys (a folder of parts, the mined line numbers)
    indexed by one task with `build`, the queries (folder, work items, mined line numbers) searched item by item
    in parallel tasks with `search`. The caller (paraphrastic-mine) says what an index is."""
    ray = ray_module()
    (key_dir, key_rows), (query_dir, query_items, query_rows) = keys, queries
    index = ray.put(ray.get(ray.remote(num_cpus=1)(index_task).remote(str(key_dir), key_rows, build)))
    rows = ray.put(query_rows)
    task = ray.remote(num_cpus=1)(search_task)
    found = sorted(ray.get([task.remote(index, str(query_dir), item, rows, k, search) for item in query_items]),
                   key=lambda part: part[0])  # fmt: skip
    return np.concatenate([p[1] for p in found]), np.concatenate([p[2] for p in found])


class Stopped(Error):
    """The run was interrupted (SIGINT, SIGTERM) or Ray failed under it; what is committed is kept for --resume."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def signals_noted() -> Iterator[list[int]]:
    """Inside the block SIGINT and SIGTERM are noted, not raised, in the list it yields: the driver's loop
    stops at its next turn and cleans up (an exception raised from a handler inside Ray's waiting is lost)."""
    noted: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in STOP_SIGNALS}
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def job_spec(files: list[Path], items: list[dict], args, kind: str, options: dict) -> dict:
    """What a run is of, as the staging area and the manifest record it and --resume compares it: the inputs by
    content, the model by content, the options that change the output, and the work items."""
    model = model_path(args.load_file)
    inputs = [{"file": str(f), "path": os.path.realpath(f), "bytes": f.stat().st_size,
               "sha256": file_digest(f)} for f in files]  # fmt: skip
    return {"kind": kind, "inputs": inputs, "model": {"path": str(model), "sha256": file_digest(model)},
            "options": options, "items": [{k: i[k] for k in ("file", "first", "lines")} for i in items]}  # fmt: skip


def main_files(args, kind: str, **parts) -> int:
    """paraphrastic-embed or -score --engine ray: check the inputs and the model, claim --output-dir, run the
    items not yet committed on the actors, publish. `kind` is embed or score; `parts`: what Parts takes beyond
    the model (score=True to score)."""
    files = input_files(args.input, parts.get("text_column") if kind == "embed" else None)
    dim = load_encoder(args.load_file).dim  # a bad model fails here, in one line, not in every actor; not kept
    check_truncate_dim(dim, parts.get("truncate_dim"))
    ray_module(local=not args.address)
    out = Path(args.output_dir)
    for f in files:
        if out.resolve() in Path(os.path.realpath(f)).parents:
            raise InputError(f"{f}: lies inside --output-dir {out}; write the output elsewhere")
    items = plan(files)
    options = {"strict": args.strict} | {k: v for k, v in parts.items() if k != "score"}
    try:
        job = commit.Job.open(out, job_spec(files, items, args, kind, options), resume=args.resume)
    except commit.Finished as e:
        print(str(e), file=sys.stderr)
        return 0
    try:
        return run_job(job, items, args, kind, parts)
    finally:
        stop()


def run_job(job: commit.Job, items: list[dict], args, kind: str, parts: dict) -> int:
    """Run the job's uncommitted items, committing each as it finishes, then publish. A bad input removes the
    run's folder and staging (a rerun would fail the same way); an interruption or a Ray failure keeps what is
    committed and says how to resume."""
    records = job.committed()
    todo = [i for i in items if i["item"] not in records]
    by_lines = all(i["lines"] >= 0 for i in items)  # a .gz item's lines are counted only as it is read
    bar = None

    def done(record: dict) -> None:
        job.commit(record)
        records[record["item"]] = record
        bar.update(sum(record["part_rows"]) if by_lines else 1)

    try:
        from tqdm import tqdm  # here: its import is a tenth of the local commands' start-up, which import this module

        cpus = start(args.address, args.threads)
        workers = min(args.threads or cpus, cpus)
        if note := idle_note(todo, workers):
            print(note, file=sys.stderr)
        total, unit = (sum(i["lines"] for i in items), " line") if by_lines else (len(items), " item")
        initial = sum(sum(r["part_rows"]) for r in records.values()) if by_lines else len(records)
        bar = tqdm(total=total, unit=unit, disable=args.quiet, file=sys.stderr, desc=kind, initial=initial)
        run(todo, job.staging, workers, on_done=done, model=args.load_file,
            batch_size=args.batch_size, strict=args.strict, **parts)  # fmt: skip
        check_inputs_unchanged(job.spec["inputs"])  # every row is of the content the run began with
        job.check_staged(records)
    except (Exception, KeyboardInterrupt) as e:
        if bar is not None:
            bar.leave = False  # the error line alone
            bar.close()
        if isinstance(e, InputError | ModelError):
            job.release(keep=False)
            raise
        keep = bool(records)
        job.release(keep=keep)
        signalled = isinstance(e, KeyboardInterrupt | Stopped)
        why = "interrupted" if signalled else f"stopped ({type(e).__name__}: {one_line(e)})"
        where = (f"{len(records)} of {len(items)} work items are committed in {job.out}; finish with: "
                 f"{commit.resume_command(job.record['command'])}") if keep else "nothing was kept"  # fmt: skip
        if isinstance(e, InputChanged):
            why, where = str(e), (f"{where} once the file is as it was, or give a new --output-dir" if keep else where)
        code = e.exit_code if isinstance(e, Stopped | InputChanged) else 143 if isinstance(e, Terminated) else (
            130 if signalled else 1)  # fmt: skip
        raise Stopped(f"{why}; {where}", code) from None
    bar.close()
    totals = {"bad_lines": sum(r["bad_lines"] for r in records.values()),
              "invalid_utf8_lines": sum(r["invalid_utf8_lines"] for r in records.values())}  # fmt: skip
    manifest = job.publish(records, totals)
    report(manifest, records, kind, len(job.spec["inputs"]), job.out)
    return 0


def idle_note(items: list[dict], workers: int) -> str | None:
    """The note that .gz files, one item each however long, leave fewer items than CPUs; else None."""
    whole = [i for i in items if i["lines"] < 0]
    if not whole or len(items) >= workers:
        return None
    return (f"note: fewer work items than CPUs ({len(items)} for {workers}): a .gz file is one item, as it cannot be "
            f"cut; decompress the large ones (such as {max(whole, key=lambda i: i['size'])['file']}) to have them cut "
            f"into items of {LINES_PER_ITEM:,} lines")  # fmt: skip


def check_inputs_unchanged(inputs: list[dict]) -> None:
    """Before publishing: every input still has the size and sha256 the run began with (a file rewritten in place,
    even to the same size and time, is found)."""
    for given in inputs:
        path = Path(given["path"])
        if not path.is_file() or path.stat().st_size != given["bytes"] or file_digest(path) != given["sha256"]:
            raise InputChanged(f"{given['file']}: changed during the run (its content is not the one it began with)")


def one_line(error: BaseException) -> str:
    """A failure under Ray as one line: the remote error's own first line, not Ray's tracebacks around it."""
    cause = getattr(error, "cause", None)
    error = cause if isinstance(cause, BaseException) else error
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def report(manifest: dict, records: dict, kind: str, files: int, out: Path) -> None:
    """The summary lines: rows written, bad lines (the first SHOWN named), lines with invalid UTF-8."""
    what = {"embed": "embedded", "score": "scored"}[kind]
    print(f"{what} {manifest['rows']} lines of {files} files into {len(manifest['parts'])} Parquet parts in {out}",
          file=sys.stderr)  # fmt: skip
    if manifest["bad_lines"]:
        shown = [f"{records[k]['file']}:{n}" for k in sorted(records) for n in records[k]["shown_bad"]]
        print(bad_pairs_note(manifest["bad_lines"], shown), file=sys.stderr)
    if manifest["invalid_utf8_lines"]:
        print(invalid_utf8_note(manifest["invalid_utf8_lines"]), file=sys.stderr)
