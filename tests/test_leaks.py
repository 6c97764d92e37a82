"""Nothing left behind: encode's rows are memory files with no name (or, without memfd, carry their process id),
training temporaries carry their process id and are removed by the next run once their owner is dead; a bad
--device is a usage error, never a traceback."""

import os
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from conftest import dead_pid, open_rows_files

from paraphrastic import embed_sentences, evaluate, mine_bitext, score_sentence_pairs, train, workers


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="a system without memfd")
def test_placed_rows_are_memory_files_with_no_name_that_end_with_their_array():
    """Each job's rows are a memory file that needs no folder (a container's /dev/shm holds 64 MB): once placed,
    its rows live on in the array alone, and the memory goes with it."""
    with workers.PlacedRows(10, 4) as rows:
        path, at = rows.job_file(3)
        assert path.startswith(f"/proc/{os.getpid()}/fd/") and at == 3 * 16 and rows.array.shape == (10, 4)
        workers.PlacedRows.write(path, at, np.full((2, 4), 7, np.float32))  # by name, as a worker writes
        rows.place(slice(3, 5))
        assert not os.path.exists(path)
        unplaced, _ = rows.job_file(5)
    assert not os.path.exists(unplaced)  # the block closes a job's file that never came back
    out = rows.array
    assert out[3:5].tolist() == [[7.0] * 4] * 2 and not out[:3].any() and not out[5:].any()
    del rows, out
    assert open_rows_files() == []


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="a system without memfd")
def test_a_process_forked_while_rows_are_placed_holds_none_of_their_files():
    """A process forked while a thread encodes (another pool's worker, a user's fork) gets copies of the open job
    files, and would hold their memory for its whole life: it closes them as it starts."""
    with workers.PlacedRows(10_000, 256) as rows:
        path, at = rows.job_file(0)
        workers.PlacedRows.write(path, at, np.ones((8192, 256), np.float32))
        pid = os.fork()
        if pid == 0:
            held = 99
            try:
                held = len(open_rows_files())
            finally:
                os._exit(held)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        rows.place(slice(0, 8192))
    assert rows.array[:8192].all() and workers.JOB_FILES == set()


@pytest.mark.parametrize("dim", [1, 3, 256, 1024, 1500])
def test_rows_are_placed_whatever_the_jobs_bounds_and_order(dim):
    """Jobs cut anywhere, a page shared by two jobs or one job inside a page, placed in any order: the array holds
    every row as written, and it is an ordinary array (writable, freed whole)."""
    rng = np.random.default_rng(dim)
    want = rng.standard_normal((3000, dim)).astype(np.float32)
    bounds = np.unique(np.concatenate([[0, 1, 2, 3000], rng.integers(0, 3000, 40)]))
    cuts = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    with workers.PlacedRows(len(want), dim) as rows:
        for cut in cuts:
            workers.PlacedRows.write(*rows.job_file(cut.start), want[cut])
        for k in rng.permutation(len(cuts)):
            rows.place(cuts[k])
    out = rows.array
    assert out.tobytes() == want.tobytes()
    out *= 2
    assert np.array_equal(out, want * 2)


def test_past_the_maps_allowed_rows_are_copied(monkeypatch):
    """A process may hold vm.max_map_count memory areas, past which every mmap fails (numpy's too): an array maps
    the job files that maps_allowed grants, and copies the rest."""
    monkeypatch.setattr(workers, "maps_allowed", lambda: 2)
    want = np.arange(10_000 * 3, dtype=np.float32).reshape(10_000, 3)
    with workers.PlacedRows(len(want), 3) as rows:
        for start in range(0, len(want), 1000):
            cut = slice(start, start + 1000)
            workers.PlacedRows.write(*rows.job_file(start), want[cut])
            rows.place(cut)
        with open("/proc/self/maps") as maps:
            assert sum(workers.SHARED_ROWS in line for line in maps) == 2
    assert rows.array.tobytes() == want.tobytes()


@pytest.mark.skipif(not os.path.exists("/proc/sys/vm/max_map_count"), reason="a system without vm.max_map_count")
def test_more_jobs_than_a_process_may_map_are_all_placed_and_leave_room_for_more():
    """Jobs past the system's count of memory areas (1,024 rows of one float each, a page a job): every row in
    place, and the process can still map memory after."""
    jobs = int(open("/proc/sys/vm/max_map_count").read()) + 1000
    if jobs > 200_000:
        pytest.skip("vm.max_map_count is too high for a test of its size")
    with workers.PlacedRows(jobs * 1024, 1) as rows:
        for job in range(jobs):
            workers.PlacedRows.write(*rows.job_file(job * 1024), np.full((1024, 1), job, np.float32))
            rows.place(slice(job * 1024, (job + 1) * 1024))
    assert np.array_equal(rows.array[::1024, 0], np.arange(jobs, dtype=np.float32))
    assert [np.ones(1 << 18) for _ in range(20)]  # 2 MB each: every one its own mmap


def test_a_job_file_not_all_written_is_an_error_not_a_fault():
    with workers.PlacedRows(4096, 4) as rows:
        path, at = rows.job_file(0)
        workers.PlacedRows.write(path, at, np.ones((100, 4), np.float32))
        with pytest.raises(OSError, match="rows 0..4096 were not all written"):
            rows.place(slice(0, 4096))


def test_without_memfd_job_files_of_a_dead_process_are_removed_by_the_next_call(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / f"{workers.SHARED_ROWS}.{dead_pid()}.abcdefgh"
    stale.write_bytes(b"rows of a killed encode")
    other = tmp_path / f"{workers.SHARED_ROWS}.notapid"
    other.write_bytes(b"")
    with workers.PlacedRows(10, 4) as rows:
        assert not stale.exists() and other.exists()
        path, at = rows.job_file(2)
        assert os.path.basename(path).startswith(f"{workers.SHARED_ROWS}.{os.getpid()}.")
        workers.PlacedRows.write(path, at, np.full((8, 4), 5, np.float32))
        rows.place(slice(2, 10))
        assert not os.path.exists(path)
    assert rows.array[2:].tolist() == [[5.0] * 4] * 8


def test_training_on_a_one_column_file_leaves_no_temporary(tmp_path, capsys):
    bad = tmp_path / "one.tsv"
    bad.write_text("a man is walking\nno second column\n")
    out = tmp_path / "run"
    assert train.main(["--train-file", str(bad), "--output-dir", str(out), "--max-steps", "1"]) == 2
    assert "error:" in capsys.readouterr().err
    assert (list(out.glob(".sentencepiece*")) if out.exists() else []) == []


@pytest.mark.parametrize("command", [embed_sentences, score_sentence_pairs, mine_bitext, train, evaluate])
def test_a_device_that_does_not_exist_is_a_usage_error(command, capsys):
    with pytest.raises(SystemExit) as stopped:
        command.main(["--device", "gpu"])
    assert stopped.value.code == 2 and "expected cpu, cuda, cuda:N" in capsys.readouterr().err


def test_device_names_are_read_in_any_case(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("a man\n")
    args = ["--sentence-file", str(text), "--output-file", str(tmp_path / "v.npy"), "--quiet", "--device", "CPU"]
    assert embed_sentences.main(args) == 0 and np.load(tmp_path / "v.npy").shape[0] == 1


POOL_UNDER_RUN_CLI = """import multiprocessing, sys
from paraphrastic.cli import run_cli

def square(x):
    return x * x

@run_cli
def main(argv=None):
    for _ in range(100):  # a pool's exit terminates its workers with SIGTERM, as preprocessing's pools do
        with multiprocessing.get_context("fork").Pool(2) as pool:
            assert list(pool.imap(square, range(50))) == [x * x for x in range(50)]

sys.exit(main())
"""


def test_a_forked_pool_under_run_cli_ends_its_workers_as_sigterm_always_did():
    """run_cli's SIGTERM handler is the parent's: a forked pool worker ends by SIGTERM's default, never raising
    inside its queue's lock (which left a sibling waiting on that lock for ever, and the command with it)."""
    done = subprocess.run([sys.executable, "-c", POOL_UNDER_RUN_CLI], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Terminated" not in done.stderr, done.stderr[-2000:]


FORK_UNDER_RUN_CLI = """import os, signal, sys
os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))  # lands as the child starts
from paraphrastic.cli import run_cli

@run_cli
def main(argv=None):
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # reached only where the SIGTERM was lost
    status = os.waitpid(pid, 0)[1]
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    print(os.WIFSIGNALED(status) and os.WTERMSIG(status), signal.SIGTERM in blocked, signal.getsignal(signal.SIGTERM))

sys.exit(main())
"""


def test_a_sigterm_that_reaches_a_child_as_it_forks_ends_it():
    """SIGTERM is held back across a fork (CPython drops one that lands before the child resets its signals, and
    a pool then waits for ever on the worker it terminated): the child ends by it; the parent keeps its handler."""
    done = subprocess.run([sys.executable, "-c", FORK_UNDER_RUN_CLI], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    ended_by, still_blocked, handler = done.stdout.split(maxsplit=2)
    assert ended_by == str(int(signal.SIGTERM)) and still_blocked == "False" and "_terminate" in handler


EXIT_UNDER_RUN_CLI = """import gc, sys
from paraphrastic.cli import run_cli

class Marker:
    def __del__(self):
        print("collected", flush=True)

def main(argv=None):
    gc.disable()  # nothing collects the cycle before the exit
    marker = Marker()
    marker.cycle = marker  # only a garbage collection frees it
    return 0

sys.exit((run_cli(main) if sys.argv[1] == "command" else main)())
"""


def test_a_command_ends_without_the_last_garbage_collection():
    """The interpreter's collection at exit walks every object left (torch's million: 0.3 s of each command that
    loaded it) to free memory the process gives back anyway; under run_cli it is skipped, and only there."""
    said = {
        how: subprocess.run([sys.executable, "-c", EXIT_UNDER_RUN_CLI, how], capture_output=True, text=True).stdout
        for how in ("command", "plain")
    }
    assert said == {"command": "", "plain": "collected\n"}
