"""Worker processes that turn text into vectors: the one parallel path of every command and of `Model.encode`.

Each worker is a forked copy of the calling process, so the model reaches it without pickling and its table is
shared copy-on-write; it runs on one thread (torch's too, when torch is loaded). The caller cuts its input into jobs, keeps at most two per
worker in flight (memory stays bounded whatever the input size) and takes the results back in input order, so
row i is still line i. With one worker the jobs run in the calling process itself: the same code, no fork.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from paraphrastic.fileio import Error

IN_FLIGHT = 2  # jobs per worker submitted ahead: one running, one queued
PARENT_POLL_S = 0.5  # how often a worker checks that its parent lives
WATCH_S = 1.0  # how often the caller, waiting on a job, looks at its workers
STALL_S = 120.0  # workers that use no CPU for this long while a job waits are stuck (blocked, or hung)
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


def _start(model, parent: int, data: Any) -> None:
    global _model, _given
    _model, _given = model, data
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    gc.freeze()  # what the fork brought is never garbage here: collections skip it (a seventh of the time)
    if torch := sys.modules.get("torch"):
        torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle, once
    model.warm_up()


def _watch_parent(parent: int) -> None:
    """A worker's thread: end the worker once its parent is gone (killed, even by SIGKILL), so that no worker
    lives on holding its memory; it polls, since the parent-death signal follows the forking thread, not the
    process."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _run(fn: Callable, job: Any) -> Any:
    return fn(_model, job)


class Workers:
    """A pool of `size` worker processes holding `model` (default: `threads()`, which the commands set with
    --threads) and `given` (read by jobs with `given()`); a context manager, reusable across calls until closed, in
    the process that started it."""

    def __init__(self, model, size: int | None = None, given: Any = None):
        self.model, self.owner, self.closed = model, os.getpid(), False
        self.size = max(1, size or threads())
        self.pool: cf.ProcessPoolExecutor | None = None
        if self.size > 1:
            fork = multiprocessing.get_context("fork")  # the model reaches the workers without pickling
            self.pool = cf.ProcessPoolExecutor(
                self.size, mp_context=fork, initializer=_start, initargs=(model, os.getpid(), given)
            )

    def map(self, fn: Callable[[Any, Any], Any], jobs: Iterable) -> Iterator:
        """fn(model, job) for each job, results in the order of the jobs. `fn` must be a module-level function
        (it is sent to the workers by name)."""
        if self.closed:
            raise WorkerError("this pool of worker processes was closed: start a new one (start_multi_process_pool)")
        if os.getpid() != self.owner:
            raise WorkerError(f"this pool of worker processes belongs to process {self.owner}, not to this forked "
                              "child: start a pool in the child (start_multi_process_pool)")  # fmt: skip
        if self.pool is None:
            yield from (fn(self.model, job) for job in jobs)
            return
        pending: deque[cf.Future] = deque()
        try:
            for job in jobs:
                pending.append(self._submit(_run, fn, job))
                if len(pending) >= IN_FLIGHT * self.size:
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            for future in pending:
                future.cancel()

    def start(self) -> None:
        """Fork the workers now instead of at the first job, so that they start and warm up (`warm_up`) while the
        caller still plans their jobs."""
        if self.pool is not None:
            self._submit(os.getpid)

    def _submit(self, fn: Callable, *args: Any) -> cf.Future:
        """pool.submit, which forks the workers the first time."""
        with warnings.catch_warnings(), self.died():  # Python 3.12+ warns of fork in a threaded process;
            warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
            return self.pool.submit(fn, *args)  # the workers use no lock a thread may hold

    def _result(self, future: cf.Future) -> Any:
        """The job's result, watching the workers while it waits: a worker stopped at two looks with no CPU used
        between them (a traced one, under strace, stops at every system call but runs), or workers that use no CPU
        for STALL_S, end the run with one error naming them (a job would otherwise wait for ever)."""
        idle, cpu = 0.0, None  # the workers' CPU time is read once a wait is long: a result's ms read it not at all
        held: dict[int, float | None] = {}  # the workers stopped at the last look, with their CPU time then
        with self.died():
            while True:
                try:
                    return future.result(timeout=WATCH_S)
                except cf.TimeoutError:
                    pass
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

    @contextlib.contextmanager
    def died(self) -> Iterator[None]:
        """BrokenProcessPool, now or on a later call of a broken pool, as the one error the commands document."""
        try:
            yield
        except BrokenProcessPool:
            raise WorkerError(
                "a worker process died (killed, or out of memory); nothing was written in place of the output "
                "(run again, with fewer --threads if memory is short; a kept pool must be started anew)"
            ) from None

    def pids(self) -> list[int]:
        return list(getattr(self.pool, "_processes", None) or {})  # the executor's own map of its processes

    def cpu_seconds(self) -> float | None:
        """CPU time the workers have used so far (None where /proc cannot say)."""
        times = [process_cpu(pid) for pid in self.pids()]
        return None if None in times else sum(times)

    def close(self) -> None:
        """Stop the workers (jobs already running finish first); the pool cannot be used again."""
        self.closed = True
        if self.pool is not None and os.getpid() == self.owner:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
