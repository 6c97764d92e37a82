"""Worker processes that turn text into vectors: the one parallel path of every command and of `Model.encode`.

Each worker is a forked copy of the calling process, so the model reaches it without pickling and its table is
shared copy-on-write; it runs on one thread (torch's too, when torch is loaded). The workers are forked in a tree,
so that 16 start in the time of about 5 forks however much memory the caller holds. The caller cuts its input into
jobs, sends each to a worker through that worker's own pipe, keeps at most two per worker in flight (memory stays
bounded whatever the input size) and takes the results back in input order, so row i is still line i. With one
worker the jobs run in the calling process itself: the same code, no fork. Workers that return rows by the million
(`model.encode`'s) write each job's into a memory file of its own, which the caller maps into one array (`PlacedRows`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import mmap
import multiprocessing
import os
import queue
import resource
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np

from paraphrastic.fileio import JOB_BYTES, Error, count_lines, left_by_dead, read_at, size_text, write_at

IN_FLIGHT = 2  # jobs per worker submitted ahead: one running, one queued
PARENT_POLL_S = 0.5  # how often a worker checks that its parent lives
WATCH_S = 1.0  # how often the caller, waiting on a job, looks at its workers
STALL_S = 120.0  # workers that use no CPU for this long while a job waits are stuck (blocked, or hung)
FILES_PER_WORKER = 5  # files the caller holds open per worker: its pipes (4 ends as it starts, then 2), a pidfd, 2 jobs
SPARE_FILES = 64  # files left free beyond those, for what the caller opens while its workers run
RECEIVE_S = 0.05  # the longest one thread takes in the workers' messages before another thread may
CLOSED = "this pool of worker processes was closed: start a new one (start_multi_process_pool)"
STARTED = -1  # the number of a worker's first message, which says it started and gives its pid
DIED = ("a worker process died (killed, or out of memory); nothing was written in place of the output (run again, "
        "with fewer --threads if memory is short; a kept pool must be started anew)")  # fmt: skip
SHARED_ROWS = "paraphrastic-rows"  # name of the memory files of encode's jobs (files NAME.PID.* without memfd)
_model = None  # this worker's model, set when the worker starts
_given = None  # what this worker's pool was started with for its jobs to read (see `given`)
_threads: int | None = None  # set by use_threads


class WorkerError(Error):
    """A worker process died (killed, or out of memory): the run stops, and nothing is written in place."""


def use_threads(threads: int | None = None) -> int:
    """Set the threads of this run, the commands' --threads (worker processes; torch's CPU threads too, when
    torch is loaded): `threads`, else the cores that other processes leave idle (at least 1). Spinning threads
    on busy cores are many times slower than one thread."""
    global _threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not threads:
        threads = max(1, min(cores, round(cores - busy_cores())))
    elif threads > cores:
        print(f"warning: --threads {threads} on {cores} cores: threads beyond the cores only take turns on them, "
              f"and each worker process holds its own memory; --threads {cores} runs as fast", file=sys.stderr)  # fmt: skip
    _threads = threads
    if torch := sys.modules.get("torch"):
        torch.set_num_threads(threads)
    return threads


def threads() -> int:
    """This process's threads: 1 in a worker; else what use_threads set (a command's --threads), else torch's
    thread count when torch is loaded (`torch.set_num_threads` in one's own code), else the cores."""
    if _model is not None:
        return 1
    if _threads:
        return _threads
    if torch := sys.modules.get("torch"):
        return torch.get_num_threads()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def workers_for(path: str | os.PathLike, chunk_lines: int, start: int = 0, stop: int | None = None) -> int:
    """Worker processes for lines [start, stop) of a text file: threads(), but no more than the blocks of at most
    `chunk_lines` lines that a plan cuts them into, counted where the file holds JOB_BYTES or less (one block by
    bytes): a worker without a block only costs its start (a fork, a warm-up) and its exit."""
    try:  # a regular file alone: a pipe read here would be read no more
        small = os.path.isfile(path) and not str(path).endswith(".gz") and os.path.getsize(path) <= JOB_BYTES
        lines = count_lines(path) if small else 0
    except (OSError, Error):  # not readable: the command's own read says so
        small = False
    if not small:
        return threads()
    blocks = -(-max(0, min(lines, stop if stop is not None else lines) - start) // chunk_lines)
    return max(1, min(threads(), blocks))


def busy_cores() -> float:
    """Cores other processes keep busy: the 1-minute load average, but no more than the other tasks running
    now, since the average lags (a job that ended a minute ago still counts in it)."""
    load = os.getloadavg()[0]
    running = running_tasks()
    return load if running is None else min(load, running)


def running_tasks() -> int | None:
    """Runnable tasks other than this one, from /proc/loadavg (None where there is no such file)."""
    try:
        return max(0, int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return None


def given() -> Any:
    """In a worker, the data its pool was started with (`Workers(..., given=...)`), handed over whole by the fork:
    its jobs name parts of it (slices of the caller's texts) instead of carrying them through a pipe, so that the
    caller pickles nothing at any number of workers."""
    return _given


def _fork_tree(
    lo: int, hi: int, ends: list, callers: list, serve: Callable[[int, list[int]], int], pids: list[int]
) -> None:
    """Fork workers lo..hi-1 in a tree, adding to `pids` those this process forked: each child is the first worker of
    the upper half of what is left and forks the rest of its half itself, so that N workers start in the time of
    about log2(N) forks (a fork copies the page tables of all the caller holds: 0.04 s with 8,000,000 texts).
    `ends[k]`: worker k's ends of its pipes; `callers`: the caller's ends, closed in every child;
    serve(k, forked) runs worker k and gives its exit status. A child never returns into the caller's code."""
    while lo < hi:
        mid = (lo + hi) // 2
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle, once
                for k, pair in enumerate(ends):
                    if not mid <= k < hi:
                        _close(pair)
                _close(callers)
                below: list[int] = []
                _fork_tree(mid + 1, hi, ends, [], serve, below)
                for pair in ends[mid + 1 : hi]:
                    _close(pair)
                code = serve(mid, below)
            finally:
                _flush_std_streams()
                os._exit(code)
        pids.append(pid)
        hi = mid


def _close(connections: Iterable) -> None:
    for connection in connections:
        connection.close()


def _flush_std_streams() -> None:
    """Flush stdout and stderr: before a fork, so that no child writes the caller's buffered text again."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _serve(model, given_data: Any, jobs: Connection, results: Connection, parent: int, below: list[int]) -> int:
    """A worker: say it started, warm up, then run each job that `jobs` brings and send back (number, ok, result or
    error) until the caller closes its end; wait for the workers it forked, and give the exit status. A thread
    takes in the jobs as they come, so that the caller never waits to send one."""
    global _model, _given
    _model, _given = model, given_data
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    gc.freeze()  # what the fork brought is never garbage here: collections skip it (a seventh of the time)
    if torch := sys.modules.get("torch"):
        torch.set_num_threads(1)
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_take_in, args=(jobs, inbox), daemon=True).start()
    code = 0
    try:
        results.send((STARTED, True, os.getpid()))
        model.warm_up()
        while (job := inbox.get()) is not None:
            number, fn, arg = job
            try:
                reply = (number, True, fn(model, arg))
            except BaseException as e:  # the caller raises it, as if the job had run there
                reply = (number, False, (e, traceback.format_exc()))
            _reply(results, reply)
    except OSError:  # the caller closed the pool without taking this result, or is gone
        code = 1
    for pid in below:  # they end as this one does: the caller closed their pipes too
        os.waitpid(pid, 0)
    return code


def _reply(results: Connection, reply: tuple) -> None:
    """Send a job's reply; one that would not pickle goes back as an error that says so."""
    try:
        data = ForkingPickler.dumps(reply)
    except Exception as e:
        what = "result" if reply[1] else "error"
        data = ForkingPickler.dumps((reply[0], False, (WorkerError(f"a job's {what} could not be sent back: {e}"), "")))
    results.send_bytes(data)


def _take_in(jobs: Connection, inbox: queue.SimpleQueue) -> None:
    """A worker's thread: jobs from the caller into `inbox`, then None once the caller says stop or is gone (or a
    job would not unpickle: the worker ends, and the caller says a worker died)."""
    with contextlib.suppress(Exception):
        while (job := jobs.recv()) is not None:
            inbox.put(job)
    inbox.put(None)


def _watch_parent(parent: int) -> None:
    """A worker's thread: end the worker once its parent is gone (killed, even by SIGKILL), so that no worker
    lives on holding its memory; it polls, since the parent-death signal follows the forking thread, not the
    process."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _stop(jobs: list[Connection], results: list[Connection], forked: list[int], exits: list[int], owner: int) -> None:
    """Tell each worker of a pool to stop and close its pipes, so that each ends after the jobs it holds (one
    sending a result no one takes ends at once), and wait for the workers the caller forked (each waits for those it
    forked; a stopped one is killed: nothing it holds is wanted, and it would hold the caller for ever). The stop is
    a message, not the pipe's end: a process forked meanwhile (another pool's worker, one's own fork) holds copies
    of the caller's ends."""
    if os.getpid() != owner:
        return
    for connection in jobs:
        with contextlib.suppress(OSError):
            connection.send(None)
    _close(jobs + results)
    for pid in forked:
        if process_state(pid) in ("T", "t"):  # stopped (SIGSTOP, a debugger): it would never read the stop
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    for fd in exits:
        os.close(fd)
    for each in (jobs, results, forked, exits):
        each.clear()


class RemoteTraceback(Exception):
    """Where a job failed in its worker: the cause of the error the caller raises."""

    def __str__(self) -> str:
        return self.args[0]


class Workers:
    """A pool of `size` worker processes holding `model` (default: `threads()`, which the commands set with
    --threads) and `given` (read by jobs with `given()`); a context manager, reusable across calls until closed, by
    any thread of the process that started it. Each worker has its own pipes: the caller sends a job to a started
    worker that holds fewer than IN_FLIGHT, and takes results in as they come."""

    def __init__(self, model, size: int | None = None, given: Any = None):
        self.model, self.given, self.owner, self.closed = model, given, os.getpid(), False
        self.size = max(1, size or threads())
        self.jobs: list[Connection] = []  # the caller's ends, one per worker: jobs out, results in
        self.results: list[Connection] = []
        self.forked: list[int] = []  # the workers this process forked (the top of the tree)
        self.exits: list[int] = []  # a pidfd of each started worker, readable once it ends
        # a pool dropped unclosed, or still open at exit, stops its workers too
        self._stop = weakref.finalize(self, _stop, self.jobs, self.results, self.forked, self.exits, self.owner)
        self.pid_of: dict[int, int] = {}  # worker -> pid, once it has said it started
        self.held: list[deque[int]] = [deque() for _ in range(self.size)]  # numbers of the jobs each holds
        self.done: dict[int, tuple[bool, Any]] = {}  # results taken in and not yet yielded
        self.wanted: set[int] = set()  # numbers of the jobs whose results a map still waits for
        self.number, self.broken = 0, False
        self.lock = threading.RLock()  # a pool may be used by several threads at once

    def map(self, fn: Callable[[Any, Any], Any], jobs: Iterable) -> Iterator:
        """fn(model, job) for each job, results in the order of the jobs, with at most IN_FLIGHT jobs per worker
        sent or waiting. `fn` must be a module-level function (it is sent to the workers by name)."""
        self.start()
        if self.size == 1:
            yield from (fn(self.model, job) for job in jobs)
            return
        order: deque[int] = deque()
        try:
            for job in jobs:
                if len(order) >= IN_FLIGHT * self.size:
                    yield self._take(order.popleft())
                order.append(self._submit(fn, job))
            while order:
                yield self._take(order.popleft())
        finally:
            with self.lock:
                for number in order:  # results no one will take: dropped as they come
                    self.wanted.discard(number)
                    self.done.pop(number, None)

    def start(self, wait: bool = False) -> None:
        """Fork the workers now instead of at the first job, so that they start and warm up (`warm_up`) while the
        caller still plans their jobs; `wait`: return once every worker has started. A pool closed, broken (a worker
        died) or another process's raises WorkerError."""
        if self.closed:
            raise WorkerError(CLOSED)
        if os.getpid() != self.owner:
            raise WorkerError(f"this pool of worker processes belongs to process {self.owner}, not to this forked "
                              "child: start a pool in the child (start_multi_process_pool)")  # fmt: skip
        if self.broken:
            raise WorkerError(DIED)
        with self.lock:
            if self.size > 1 and not self.jobs:
                self._launch()
        if wait and self.size > 1:
            self._wait(lambda: len(self.pid_of) == self.size)

    def _launch(self) -> None:
        getattr(self.model, "before_fork", lambda: None)()  # what every worker reads, made once, shared
        make_room_for_files(self.size)
        make_room_for_memory(self.size)
        pipes = [(multiprocessing.Pipe(duplex=False), multiprocessing.Pipe(duplex=False)) for _ in range(self.size)]
        ends = [(jobs_in, results_out) for (jobs_in, _), (_, results_out) in pipes]
        self.jobs.extend(jobs_out for (_, jobs_out), _ in pipes)
        self.results.extend(results_in for _, (results_in, _) in pipes)

        def serve(k: int, below: list[int]) -> int:
            return _serve(self.model, self.given, *ends[k], os.getppid(), below)

        _flush_std_streams()
        try:  # Python 3.12+ warns of fork in a threaded process; the workers use no lock a thread may hold
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
                _fork_tree(0, self.size, ends, self.jobs + self.results, serve, self.forked)
        except OSError as e:
            self.close()
            raise WorkerError(f"could not start {self.size} worker processes ({e}): run with fewer --threads") from None
        finally:
            for pair in ends:
                _close(pair)

    def _free(self) -> int | None:
        """The started worker holding fewest jobs, if fewer than IN_FLIGHT (than 1 until all have started, so that
        the first jobs spread over all the workers), or None."""
        most = IN_FLIGHT if len(self.pid_of) == self.size else 1
        held = [(len(self.held[k]), k) for k in self.pid_of if len(self.held[k]) < most]
        return min(held)[1] if held else None

    def _submit(self, fn: Callable, job: Any) -> int:
        """Send fn(model, job) to a free worker (`_free`), once there is one, and give the job's number."""
        while True:
            with self.lock:
                if (worker := self._free()) is not None:
                    number, self.number = self.number, self.number + 1
                    try:
                        self.jobs[worker].send((number, fn, job))
                    except OSError:
                        self.broken = True
                        raise WorkerError(DIED) from None
                    self.held[worker].append(number)
                    self.wanted.add(number)
                    return number
            self._wait(lambda: self._free() is not None)

    def _take(self, number: int) -> Any:
        """Job `number`'s result, or its error raised here."""
        self._wait(lambda: number in self.done)
        with self.lock:
            self.wanted.discard(number)
            ok, value = self.done.pop(number)
        if ok:
            return value
        error, where = value
        raise error from RemoteTraceback(where) if where else None

    def _receive(self, timeout: float) -> None:
        """Take in what the workers send within `timeout` seconds: that one started, or a job's result. A worker's
        end is seen by its pidfd (where the system has them), since a process forked meanwhile may hold a copy of
        its pipe, which then never ends."""
        for ready in wait_for([*self.results, *self.exits], timeout):
            try:
                if ready in self.exits:
                    raise EOFError
                worker = self.results.index(ready)
                number, ok, value = ready.recv()
            except (EOFError, OSError):
                self.broken = True
                raise WorkerError(DIED) from None
            if number == STARTED:
                self.pid_of[worker] = value
                if hasattr(os, "pidfd_open"):
                    with contextlib.suppress(OSError):  # an old kernel, or a worker already gone: its pipe ends
                        self.exits.append(os.pidfd_open(value))
                continue
            self.held[worker].popleft()
            if number in self.wanted:
                self.done[number] = (ok, value)

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Take in what the workers send until `ready()`, watching them while it waits: a worker stopped at two
        looks with no CPU used between them (a traced one, under strace, stops at every system call but runs), or
        workers that use no CPU for STALL_S, end the run with one error naming them (a job would otherwise wait for
        ever)."""
        idle, cpu = 0.0, None  # the workers' CPU time is read once a wait is long: a result's ms read it not at all
        held: dict[int, float | None] = {}  # the workers stopped at the last look, with their CPU time then
        look = time.monotonic() + WATCH_S
        while not ready():
            with self.lock:  # one thread at a time takes in what comes, for all (RECEIVE_S at most)
                if self.closed:
                    raise WorkerError(CLOSED)
                if not ready():
                    self._receive(min(RECEIVE_S, max(0.0, look - time.monotonic())))
            if ready() or time.monotonic() < look:
                continue
            look = time.monotonic() + WATCH_S
            states = {pid: process_state(pid) for pid in self.pids()}
            was, held = held, {pid: process_cpu(pid) for pid, state in states.items() if state in ("T", "t")}
            if stopped := [str(pid) for pid, used in held.items() if pid in was and was[pid] == used]:
                raise WorkerError(f"worker process {', '.join(stopped)} is stopped (SIGSTOP, or a debugger): "
                                  f"continue it (kill -CONT {' '.join(stopped)}) or stop the run")  # fmt: skip
            now = self.cpu_seconds()
            idle = idle + WATCH_S if now is not None and now == cpu else 0.0
            cpu = now
            if idle >= STALL_S:
                raise WorkerError(f"the worker processes ({', '.join(map(str, states))}) used no CPU for "
                                  f"{idle:.0f} s while a job waited: stuck; stop the run and look at them")  # fmt: skip

    def pids(self) -> list[int]:
        """The process ids of the workers that have started."""
        return list(self.pid_of.values())

    def cpu_seconds(self) -> float | None:
        """CPU time the workers have used so far (None where /proc cannot say)."""
        times = [process_cpu(pid) for pid in self.pids()]
        return None if None in times else sum(times)

    def close(self) -> None:
        """Stop the workers: each ends after the jobs it holds (their results are dropped), and the pool cannot be
        used again."""
        with self.lock:
            self.closed = True
            self._stop()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


WORKER_BYTES = 64 << 20  # the least a worker process holds of its own (its jobs' lines and rows; a killed one: 143 MB)


def available_memory() -> int:
    """Bytes of memory available to new allocations (MemAvailable), or free memory where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def make_room_for_memory(workers: int) -> None:
    """Refuse, before any fork, more workers than the memory holds (WORKER_BYTES each): `--threads 1000` forked
    until the kernel's out-of-memory killer took processes, this run's and others'."""
    need, have = workers * WORKER_BYTES, available_memory()
    if need > have:
        raise WorkerError(f"{workers} worker processes need at least {need / 2**30:.1f} GiB, and {have / 2**30:.1f} GiB "
                          f"is available: run with fewer --threads (this machine has {os.cpu_count()} cores)")  # fmt: skip


def make_room_for_files(workers: int) -> None:
    """Let this process open the files that `workers` workers take (FILES_PER_WORKER each) beyond those open now:
    256 workers need more than the usual limit of 1,024 (`ulimit -n`), so it is raised, as far as the hard limit
    allows; past that, a WorkerError says what to do, before any worker starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    need += FILES_PER_WORKER * workers + SPARE_FILES
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    except (ValueError, OSError):
        raise WorkerError(f"{workers} worker processes need about {need:,} open files, and this process may open "
                          f"{hard:,} (ulimit -Hn): run with fewer --threads, or raise the limit") from None  # fmt: skip


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_state(pid: int) -> str | None:
    """A process's state letter (R running, S sleeping, T stopped, ...), or None where unknown."""
    fields = _proc_stat(pid)
    return fields[0] if fields else None


def process_cpu(pid: int) -> float | None:
    """User plus system CPU seconds a process has used, or None where unknown."""
    fields = _proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else None


class PlacedRows:
    """encode's output (rows, dim) of `dtype` (float32, or packed signs as uint8 or int8), filled by worker processes
    that share no lock: the rows of each job go into a memory file of the job's own (`job_file`), written by its
    worker with one pwrite, and `place` maps the file's whole pages into this process's one array (copying the part
    pages at its two ends, and whole jobs past the maps a process may hold: `maps_allowed`). Writers of one shared
    file take turns at its lock, so that 16 workers could pass no more rows than one. A job's file is a memfd, which
    the workers open as /proc/PID/fd/N: it needs no room in /dev/shm (64 MB in a container), and nothing of it
    outlives the processes that hold it, killed or not. Where the system has no memfd (or no /proc), it is a file of
    the temporary folder whose name holds this process's id, and the next call removes what a killed one left. Use
    it in a `with` block: files not placed by its end are closed."""

    def __init__(self, rows: int, dim: int, dtype: np.dtype | str = np.float32):
        self.dtype = np.dtype(dtype)
        self.row_bytes, self.files = dim * self.dtype.itemsize, {}  # the jobs' files not placed yet, by first row
        try:
            self.memory = mmap.mmap(-1, max(rows * self.row_bytes, 1))  # shared, as the file pages placed in it
        except OSError:
            raise MemoryError(
                f"Unable to allocate {size_text(rows * self.row_bytes)} for encode's {rows:,} rows of {dim} "
                f"{self.dtype}: encode fewer texts at a time, or write the vectors to a file (paraphrastic-embed)"
            ) from None
        self.array = np.frombuffer(self.memory, self.dtype, rows * dim).reshape(rows, dim)
        self.in_memory = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")
        self.maps_left = maps_allowed()
        if not self.in_memory:
            for old in left_by_dead(Path(tempfile.gettempdir()), SHARED_ROWS):
                if old.is_file():
                    old.unlink(missing_ok=True)

    def job_file(self, start: int) -> tuple[str, int]:
        """A new file for the rows from row `start` on, by name, and the byte at which a worker writes them there
        (the file begins at the page of the array that holds row `start`)."""
        if self.in_memory:
            fd = os.memfd_create(SHARED_ROWS)
            path = f"/proc/{os.getpid()}/fd/{fd}"
        else:
            fd, path = tempfile.mkstemp(prefix=f"{SHARED_ROWS}.{os.getpid()}.", dir=tempfile.gettempdir())
        self.files[start] = (fd, path)
        JOB_FILES.add(fd)
        return path, start * self.row_bytes % mmap.PAGESIZE

    @staticmethod
    def write(path: str, at: int, rows: np.ndarray) -> None:
        """A worker's part: write a job's rows (the output's type) into its file, by name, at `at` (what `job_file`
        gave)."""
        fd = os.open(path, os.O_WRONLY)
        try:
            write_at(fd, np.ascontiguousarray(rows), at)
        finally:
            os.close(fd)

    def place(self, cut: slice) -> None:
        """Put the rows of `cut`, written into its job's file, in place in the array, and close the file."""
        fd, path = self.files.pop(cut.start)
        try:
            a, b, page = cut.start * self.row_bytes, cut.stop * self.row_bytes, mmap.PAGESIZE
            first = a - a % page  # the array's byte at the file's start
            if os.fstat(fd).st_size < b - first:  # a page mapped past a file's end would fault when read
                raise OSError(f"encode's rows {cut.start}..{cut.stop} were not all written")
            lo, hi = -(-a // page) * page, b - b % page  # the whole pages of [a, b)
            copied = ((a, b),)
            if lo < hi and self.maps_left:
                map_file(self.array.ctypes.data + lo, hi - lo, fd, lo - first)
                self.maps_left -= 1
                copied = ((a, lo), (hi, b))
            out = self.array.reshape(-1).view(np.uint8)
            for x, y in copied:
                read_at(fd, memoryview(out[x:y]), x - first)
        finally:
            self.forget(fd, path)

    def forget(self, fd: int, path: str) -> None:
        if fd not in JOB_FILES:  # in a forked child: closed as it started, and not its own to remove
            return
        JOB_FILES.discard(fd)
        os.close(fd)
        if not self.in_memory:
            os.unlink(path)

    def __enter__(self) -> PlacedRows:
        return self

    def __exit__(self, *exc) -> None:
        while self.files:
            self.forget(*self.files.popitem()[1])


JOB_FILES: set[int] = set()  # the job files open in this process, which a process forked from it closes at once


def close_job_files() -> None:
    """In a child just forked: close the job files it got, whose memory it would otherwise hold for its life after
    their encode is done (another pool's worker, forked while a thread encodes)."""
    for fd in JOB_FILES:
        os.close(fd)
    JOB_FILES.clear()


os.register_at_fork(after_in_child=close_job_files)


def maps_allowed() -> int:
    """How many job files a new PlacedRows may map into place: a map splits the array's memory area in up to two
    more, and a process may hold vm.max_map_count areas (65,530), past which every mmap fails, numpy's and malloc's
    too. Half of what is left stays for the rest; past that (vm.max_map_count / 4 jobs at most: 134,000,000 texts
    in jobs of 8,192), the caller copies the rows."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        held = Path("/proc/self/maps").read_bytes().count(b"\n")
    except (OSError, ValueError):
        return MAPS_ELSEWHERE
    return max(0, limit // 2 - held) // 2


MAPS_ELSEWHERE = 8192  # job files a PlacedRows maps where the system says nothing of its limit (no /proc)
MAP_FIXED = 0x10  # mmap(2)'s flag, the same on Linux, macOS and the BSDs (Python's mmap module has no name for it)


def map_file(address: int, size: int, fd: int, offset: int) -> None:
    """Map `size` bytes of the open file `fd` from `offset`, shared, at `address`, in place of the pages there:
    mmap(2) with MAP_FIXED, which Python's mmap module does not offer."""
    libc = c_library()
    prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED
    if libc.mmap(address, size, prot, flags, fd, offset) != address:
        code = ctypes.get_errno()
        raise OSError(code, f"could not map encode's rows into place: {os.strerror(code)}")


@functools.cache
def c_library():
    """The C library, its mmap declared."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64)
    return libc
