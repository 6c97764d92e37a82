"""The parallel path: N worker processes give the one-worker rows bit for bit, in input order, and a worker that
dies stops the run with one clear error and no output."""

import contextlib
import gc
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import generated_sentences, open_rows_files

import paraphrastic
from paraphrastic import embed_sentences, models, score_sentence_pairs, static
from paraphrastic.fileio import Error
from paraphrastic.workers import WorkerError, Workers, given, process_state

# empty lines, invalid UTF-8, CRLF, a tab, and a last line without a newline
AWKWARD = b"first line\n\n\xff\xfe broken bytes\nwindows line\r\n  \nsome\ttab\n\xc3\xa9t\xc3\xa9 caf\xc3\xa9\nno newline at end"


@pytest.fixture
def awkward_file(tmp_path):
    body = "\n".join(generated_sentences(3000, seed=3)).encode() + b"\n"
    path = tmp_path / "in.txt"
    path.write_bytes(body + AWKWARD)
    return path


def test_embed_file_rows_are_the_same_for_any_number_of_workers(tiny_model, awkward_file, tmp_path):
    outs = []
    for workers in (1, 2, 3):
        out = tmp_path / f"out{workers}.npy"
        stats = embed_sentences.embed_file(tiny_model, awkward_file, out, chunk_lines=97, batch_size=50,
                                           workers=workers, quiet=True)  # fmt: skip
        assert stats["rows"] == 3008 and stats["invalid_utf8_lines"] == 1
        outs.append(np.load(out))
    lines = awkward_file.read_bytes().decode("utf-8", "replace").split("\n")
    assert len(lines) == 3008
    expected = tiny_model.embed_here([line.removesuffix("\r") for line in lines])
    for got in outs:
        assert got.tobytes() == expected.tobytes()


def test_score_rows_are_the_same_for_any_number_of_workers(tiny_model_file, tmp_path):
    sentences = generated_sentences(2001, seed=5)
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(
        "\n".join(f"{a}\t{b}" for a, b in zip(sentences[:-1], sentences[1:], strict=True)) + "\nbad line\n\tright only"
    )
    texts = []
    for threads in ("1", "2"):
        out = tmp_path / f"scores{threads}.tsv"
        args = ["--sentence-pair-file", pairs, "--load-file", tiny_model_file, "--output-file", out]
        args += ["--threads", threads, "--chunk-lines", "101", "--skip-bad-lines", "--quiet"]
        assert score_sentence_pairs.main(list(map(str, args))) == 0
        texts.append(out.read_text())
    assert texts[0] == texts[1]
    rows = texts[0].splitlines()
    assert len(rows) == 2002 and rows[-2].endswith("\tnan") and rows[-1].endswith("\tnan")


@pytest.mark.parametrize("command", ["embed", "score"])
def test_a_file_of_one_block_is_done_without_forking_workers(tiny_model_file, tmp_path, monkeypatch, command):
    """Ten lines, one block of work, with --threads 4: no worker is forked (any would only start and stop)."""

    def launch(self):
        raise AssertionError(f"{self.size} workers forked for one block")

    monkeypatch.setattr(Workers, "_launch", launch)
    path = tmp_path / "in.txt"
    path.write_text("".join(f"{a}\t{a}\n" for a in generated_sentences(10, seed=1)))
    out = tmp_path / "out"
    if command == "embed":
        args = ["--sentence-file", path, "--output-file", out.with_suffix(".npy")]
        main = embed_sentences.main
    else:
        args = ["--sentence-pair-file", path, "--output-file", out.with_suffix(".tsv")]
        main = score_sentence_pairs.main
    assert main([*map(str, args), "--load-file", str(tiny_model_file), "--threads", "4", "--quiet"]) == 0


def test_encode_uses_workers_for_large_inputs_and_gives_the_same_rows(tiny_model, monkeypatch):
    texts = generated_sentences(5000, seed=7) + ["", "\ufffd"]
    here = tiny_model.embed_here(texts)
    monkeypatch.setattr(static, "PARALLEL_MIN", 1000)
    torch.set_num_threads(2)
    try:
        assert tiny_model.encode(texts).tobytes() == here.tobytes()  # a pool of its own, started and closed
    finally:
        torch.set_num_threads(1)
    with tiny_model.start_multi_process_pool(workers=2) as pool:  # kept across calls, any input size
        assert tiny_model.encode(texts, pool=pool).tobytes() == here.tobytes()
        assert tiny_model.encode(texts[:3], pool=pool).tobytes() == here[:3].tobytes()
        pairs = list(zip(texts[:100], texts[100:200], strict=True))
        assert tiny_model.score_raw_text(pairs, pool=pool) == tiny_model.score_raw_text(pairs)


def test_forked_workers_name_the_first_text_that_is_not_a_string(tiny_model, monkeypatch):
    """A pool forked for its texts checks them in the workers, each its own slice (the caller makes no pass over
    them): the error still names the first bad item by its position in the whole list, and leaves nothing."""
    texts = generated_sentences(5000, seed=8)
    texts[3100], texts[4500] = b"bytes, not text", 7  # in different jobs: the later one must not be named
    monkeypatch.setattr(static, "PARALLEL_MIN", 1000)
    monkeypatch.setattr(static, "JOB_TEXTS", 500)
    torch.set_num_threads(2)
    try:
        with pytest.raises(TypeError, match=r"texts\[3100\] is bytes b'bytes, not text', not a string"):
            tiny_model.encode(texts)
        texts[3100] = "fine again"
        with pytest.raises(TypeError, match=r"texts\[4500\] is int 7, not a string"):
            tiny_model.encode(texts)
    finally:
        torch.set_num_threads(1)
    gc.collect()  # the errors' tracebacks hold the calls' frames, and the frames the rows
    assert open_rows_files() == []


def test_encode_takes_a_single_string_as_sentence_transformers_does(tiny_model):
    vector = tiny_model.encode("a man is riding a red bicycle")
    assert vector.shape == (tiny_model.dim,)
    assert vector.tobytes() == tiny_model.encode(["a man is riding a red bicycle"])[0].tobytes()
    with pytest.raises(TypeError):
        tiny_model.embed_raw_text("one string")


class DyingModel(models.SPModel):
    """Kills its own process when it embeds in a worker (a process other than the test's)."""

    parent = os.getpid()

    def embed_here(self, texts, batch_size=8192):
        if os.getpid() != self.parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().embed_here(texts, batch_size)


def test_a_killed_worker_gives_one_clear_error_and_no_output(tiny_model, awkward_file, tmp_path):
    dying = DyingModel(tiny_model.tokenizer, tiny_model.embedding.weight.data)
    out = tmp_path / "out.npy"
    out.write_bytes(b"the previous output")
    with pytest.raises(WorkerError, match="worker process died") as caught:
        embed_sentences.embed_file(dying, awkward_file, out, chunk_lines=100, workers=2, quiet=True)
    assert isinstance(caught.value, Error)  # the commands print it as one `error:` line
    assert out.read_bytes() == b"the previous output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.npy"]  # no temporary left


def test_an_error_in_a_worker_reaches_the_caller_with_its_line(tiny_model, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(500)) + b"\xff\n")
    with pytest.raises(Error, match=r"bad.txt:501: invalid UTF-8"):
        embed_sentences.embed_file(tiny_model, path, tmp_path / "o.npy", chunk_lines=64, workers=2, strict=True)
    assert not (tmp_path / "o.npy").exists()


def test_workers_keep_input_order_with_bounded_jobs_in_flight(tiny_model):
    with Workers(tiny_model, 2) as pool:
        assert list(pool.map(square, range(50))) == [i * i for i in range(50)]


def square(model, job):
    return job * job


def texts_pooled(model, job) -> int:
    return model.pooled


def test_the_workers_start_warm_while_the_caller_plans(tiny_model_file, tmp_path, monkeypatch):
    """embed_file forks its workers before it plans the input, and each embeds a text as it starts (warm_up): what a
    first embedding loads is loaded while the input is planned, not at the first job."""
    encoder = paraphrastic.load_encoder(tiny_model_file)
    with Workers(encoder, 2) as pool:
        pool.start()
        assert (
            list(pool.map(texts_pooled, range(4))) == [static.GATHER_PIECES] * 4
        )  # the warm-up's batch, in either worker
    seen, before = [], set(children(os.getpid()))  # this process's own children (a local Ray's, in a suite run)
    plan = embed_sentences.worker_blocks
    monkeypatch.setattr(embed_sentences, "worker_blocks", lambda *a: seen.append(children(os.getpid())) or plan(*a))
    path = tmp_path / "in.txt"
    path.write_text("\n".join(generated_sentences(300, seed=1)) + "\n")
    embed_sentences.embed_file(encoder, path, tmp_path / "out.npy", chunk_lines=50, workers=2, quiet=True)
    assert len(seen) == 1 and len(set(seen[0]) - before) == 2


def given_letters(model, cut: slice) -> str:
    return "".join(given()[cut])


def test_workers_read_the_data_their_pool_was_forked_with(tiny_model):
    """A pool started with `given` (encode's, with the caller's texts) hands it to its workers by the fork: a job names
    a slice and the worker reads it from its own copy, so that the caller pickles no text whatever the workers."""
    letters = [chr(97 + i % 26) for i in range(1000)]
    with Workers(tiny_model, 2, given=letters) as pool:
        assert list(pool.map(given_letters, [slice(0, 3), slice(26, 30), slice(998, 1000)])) == ["abc", "abcd", "kl"]


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


ENCODE = """import sys
import paraphrastic
from paraphrastic import workers
workers.use_threads(2)
model = paraphrastic.load_encoder(sys.argv[1])
texts = open(sys.argv[2]).read().splitlines()
while True:
    model.encode(texts)
"""


def run_of(command: str, text: Path, pairs: Path, model: Path, out: Path) -> list[str]:
    """The command line of a run of `command` (embed, score, or a script calling encode) with 2 workers."""
    if command == "encode":
        return [sys.executable, "-c", ENCODE, str(model), str(text)]
    module, given = {"embed": ("embed_sentences", ["--sentence-file", text]),
                     "score": ("score_sentence_pairs", ["--sentence-pair-file", pairs])}[command]  # fmt: skip
    return [sys.executable, "-m", f"paraphrastic.{module}", *map(str, given), "--output-file", str(out),
            "--load-file", str(model), "--threads", "2", "--quiet"]  # fmt: skip


def left_by(pid: int, *folders: Path) -> list[str]:
    """Files in `folders` (those that exist) whose names carry the process id `pid` (temporaries, shared rows)."""
    return [p.name for folder in folders if folder.is_dir() for p in folder.iterdir() if f".{pid}." in p.name]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("command", ["embed", "score", "encode"])
def test_a_killed_run_leaves_no_process_and_no_file_after_the_next_run(tiny_model_file, tmp_path, command, how):
    """embed, score or encode with 2 workers, killed while its workers run: no process of the run alive 5 s later
    (the workers watch their parent); SIGTERM is Ctrl-C's clean-up (exit 143); and once the next run is done, no
    file of the killed run is left in /dev/shm or beside the output."""
    sentences = generated_sentences(2000, seed=4)
    text, pairs = tmp_path / "big.txt", tmp_path / "pairs.txt"
    text.write_text("".join(s + "\n" for s in sentences) * 200)
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(sentences, sentences[1:], strict=False)) * 200)
    out = tmp_path / "out.bin"
    proc = subprocess.Popen(run_of(command, text, pairs, tiny_model_file, out), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while len(children(proc.pid)) < 2:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    workers = children(proc.pid)
    time.sleep(0.5)
    proc.send_signal(how)
    code = proc.wait()
    for _ in range(50):  # up to 5 s
        if not [pid for pid in workers if alive(pid)]:
            break
        time.sleep(0.1)
    assert [pid for pid in workers if alive(pid)] == []
    if how == signal.SIGTERM and command != "encode":  # a script of one's own has Python's default SIGTERM
        assert code == 143 and "interrupted" in proc.stderr.read()
        assert left_by(proc.pid, tmp_path, Path("/dev/shm"), Path(tempfile.gettempdir())) == []
    text.write_text("".join(s + "\n" for s in sentences) * 15)  # the next run: 30,000 lines, workers again
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(sentences, sentences[1:], strict=False)) * 15)
    script = ENCODE.replace("while True:\n    ", "")
    nxt = run_of(command, text, pairs, tiny_model_file, out)
    subprocess.run([sys.executable, "-c", script, *nxt[3:]] if command == "encode" else nxt, check=True)
    assert left_by(proc.pid, tmp_path, Path("/dev/shm"), Path(tempfile.gettempdir())) == []


def say_and_sleep(model, marker: str) -> str:
    """A job that writes its worker's pid to `marker` (when one is named), then sleeps: a job held by that worker."""
    if marker:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(3)
    return marker


def test_a_stopped_worker_is_named_in_one_error(tiny_model, tmp_path):
    markers = [str(tmp_path / name) for name in "ab"]
    with Workers(tiny_model, 2) as pool:
        results = pool.map(say_and_sleep, ["", *markers])
        assert next(results) == ""
        while not Path(markers[0]).exists() or not Path(markers[0]).read_text():
            time.sleep(0.01)
        stopped = int(Path(markers[0]).read_text())  # a worker stopped while it holds a job that a result waits on
        os.kill(stopped, signal.SIGSTOP)
        try:
            with pytest.raises(WorkerError, match=f"worker process {stopped} is stopped .*kill -CONT {stopped}"):
                list(results)
        finally:
            os.kill(stopped, signal.SIGCONT)


def test_a_stopped_worker_ends_the_run_within_seconds_and_is_not_waited_for(tiny_model, tmp_path):
    """The stop is named, then the pool closes without the worker continued: it once waited on the stopped worker
    until a SIGCONT (983 s), printing nothing."""
    marker = str(tmp_path / "a")
    pool = Workers(tiny_model, 2)
    results = pool.map(say_and_sleep, ["", marker])
    assert next(results) == ""  # the jobs are sent
    while not Path(marker).exists() or not Path(marker).read_text():
        time.sleep(0.01)
    stopped = int(Path(marker).read_text())
    os.kill(stopped, signal.SIGSTOP)
    began = time.monotonic()
    try:
        with pytest.raises(WorkerError, match=f"worker process {stopped} is stopped"):
            list(results)
        closing = threading.Thread(target=pool.close, daemon=True)
        closing.start()
        closing.join(timeout=60)
        assert not closing.is_alive() and process_state(stopped) is None
        assert time.monotonic() - began < 60
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)


def spin_for(model, seconds: float) -> float:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return seconds


def test_a_traced_worker_that_runs_is_not_called_stopped(tiny_model, monkeypatch):
    """Under strace a worker is in the stopped state ("t") at every system call, yet it runs: a worker seen stopped
    counts as stopped only when it used no CPU between two looks."""
    from paraphrastic import workers

    monkeypatch.setattr(workers, "process_state", lambda pid: "t")
    with Workers(tiny_model, 2) as pool:
        assert list(pool.map(spin_for, [2.5, 2.5])) == [2.5, 2.5]  # both workers busy, both "t" at every look


def sleep_for(model, seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_workers_that_use_no_cpu_while_a_job_waits_are_named_stuck(tiny_model, monkeypatch):
    """The stall check (STALL_S, scaled down here) reads the workers' CPU time only once a wait runs long, and still
    names workers that sleep through it (a worker's thread that checks its parent may wake in a window: a later
    window catches them)."""
    from paraphrastic import workers

    monkeypatch.setattr(workers, "WATCH_S", 0.2)
    monkeypatch.setattr(workers, "STALL_S", 0.6)
    with Workers(tiny_model, 2) as pool:
        started = time.perf_counter()
        with pytest.raises(WorkerError, match=r"the worker processes \(\d+, \d+\) used no CPU for 1 s"):
            list(pool.map(sleep_for, [3.0]))
        assert time.perf_counter() - started < 2.9  # named before the job could end


def test_broken_closed_and_inherited_pools_each_give_one_clear_error(tiny_model):
    pool = tiny_model.start_multi_process_pool(2)
    assert list(pool.map(square, range(4))) == [0, 1, 4, 9]
    killed = pool.pids()[0]
    os.kill(killed, signal.SIGKILL)
    for _ in range(100):  # the executor notices a dead worker by its exit: give it the time to
        if not alive(killed):
            break
        time.sleep(0.05)
    time.sleep(0.5)
    for _ in range(2):  # the call that finds it broken, and every later one
        with pytest.raises(WorkerError, match="a worker process died"):
            list(pool.map(square, range(40)))
    pool.close()
    with pytest.raises(WorkerError, match="was closed: start a new one"):
        tiny_model.encode(["a", "b"], pool=pool)
    with tiny_model.start_multi_process_pool(2) as kept:
        child = os.fork()
        if child == 0:  # a forked child given the parent's pool: an error at once, not a hang
            try:
                list(kept.map(square, range(4)))
                os._exit(1)
            except WorkerError as e:
                os._exit(3 if "belongs to process" in str(e) else 2)
        assert os.waitpid(child, 0)[1] >> 8 == 3
        assert list(kept.map(square, range(4))) == [0, 1, 4, 9]


def own_pid(model, job) -> int:
    return os.getpid()


def test_workers_are_forked_in_a_tree_and_all_end_with_the_pool(tiny_model):
    """8 workers: the caller forks 4 of them (each child forks half of what is left to it), all 8 take jobs, and
    closing the pool ends every one, those its workers forked too."""
    with Workers(tiny_model, 8) as pool:
        pool.start(wait=True)
        pids = pool.pids()
        assert len(set(pids)) == 8 and len(set(pids) & set(children(os.getpid()))) == 4
        assert sorted(set(pool.map(own_pid, range(400)))) == sorted(pids)
    assert [pid for pid in pids if alive(pid)] == []


def test_a_killed_caller_ends_every_worker_of_the_tree(tmp_path):
    """Workers forked by workers watch their own parent: a caller killed by SIGKILL leaves none of 8 alive."""
    script = (
        "import sys, time\nimport paraphrastic\nfrom paraphrastic.workers import Workers\n"
        "pool = Workers(paraphrastic.load_encoder(), 8)\npool.start(wait=True)\n"
        "print(*pool.pids(), flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in proc.stdout.readline().split()]
    assert len(pids) == 8 and all(alive(pid) for pid in pids)
    proc.kill()
    proc.wait()
    for _ in range(50):  # up to 5 s: each level of the tree notices its parent's end within PARENT_POLL_S
        if not [pid for pid in pids if alive(pid)]:
            break
        time.sleep(0.1)
    assert [pid for pid in pids if alive(pid)] == []


def test_a_map_left_early_leaves_nothing_for_the_next(tiny_model):
    """Results of jobs still held when a map was left (an error, a break) are dropped as they come: the next map
    of a kept pool gets its own results only."""
    with Workers(tiny_model, 2) as pool:
        results = pool.map(sleep_for, [0.0, 0.3, 0.3, 0.3])
        assert next(results) == 0.0
        results.close()  # three jobs still held by the workers
        assert list(pool.map(square, range(10))) == [i * i for i in range(10)]


def unpicklable(model, job):
    return threading.Lock()


def fails(model, job):
    raise ValueError(f"job {job} failed")


def test_a_job_error_or_a_result_that_cannot_be_sent_reaches_the_caller(tiny_model):
    with Workers(tiny_model, 2) as pool:
        with pytest.raises(ValueError, match="job 3 failed") as caught:
            list(pool.map(fails, [3]))
        assert "in fails" in str(caught.value.__cause__)  # where it failed in the worker
        with pytest.raises(WorkerError, match="a job's result could not be sent back"):
            list(pool.map(unpicklable, [1]))
        assert list(pool.map(square, range(4))) == [0, 1, 4, 9]  # the pool still works


def test_a_fork_that_fails_gives_one_clear_error_and_leaves_no_worker(tiny_model, monkeypatch):
    """The caller's third fork fails (as when the process limit is reached): one error that says what to do, and
    the workers already forked end with the pool."""
    real, calls = os.fork, []

    def fork():
        calls.append(1)
        if len(calls) == 3:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real()

    before = set(children(os.getpid()))
    monkeypatch.setattr(os, "fork", fork)
    with pytest.raises(WorkerError, match="could not start 8 worker processes .*: run with fewer --threads"):
        Workers(tiny_model, 8).start()
    assert set(children(os.getpid())) - before == set()


def test_a_pool_raises_the_open_files_limit_it_needs(tiny_model):
    """256 workers need more open files than the usual soft limit of 1,024: the pool raises it as far as the hard
    limit allows (as `ulimit -n` would), where it used to stop with 'Too many open files'. Here 24 workers under a
    soft limit of what is open now and 40 more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
    try:
        with Workers(tiny_model, 24) as pool:
            assert list(pool.map(square, range(100))) == [x * x for x in range(100)]
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > len(os.listdir("/proc/self/fd")) + 24 * 5
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_workers_past_the_hard_open_files_limit_are_one_clear_error():
    code = """
import resource
from paraphrastic.workers import Workers
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
Workers(object(), 32).start()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert re.fullmatch(
        r"paraphrastic.workers.WorkerError: 32 worker processes need about \d+ open files, and this process may open "
        r"64 \(ulimit -Hn\): run with fewer --threads, or raise the limit",
        done.stderr.splitlines()[-1],
    )


def test_a_pool_closes_and_sees_a_death_while_another_pool_holds_copies_of_its_pipes(tiny_model):
    """A pool started while another is open forks copies of the first pool's pipe ends into its workers: the first
    still stops (its stop is a message, not the pipe's end), and a death in it is still seen at once (a pidfd)."""
    first = Workers(tiny_model, 2)
    first.start(wait=True)
    with Workers(tiny_model, 2) as second:
        second.start(wait=True)
        closing = threading.Thread(target=first.close, daemon=True)
        closing.start()
        closing.join(5)  # a close that waited for the pipes' end would wait for `second` to close
        assert not closing.is_alive() and not [pid for pid in first.pids() if alive(pid)]
        broken = Workers(tiny_model, 2)
        broken.start(wait=True)
        with Workers(tiny_model, 2) as third:
            third.start(wait=True)
            os.kill(broken.pids()[0], signal.SIGKILL)
            started = time.perf_counter()
            with pytest.raises(WorkerError, match="a worker process died"):
                list(broken.map(sleep_for, [0.5] * 8))
            assert time.perf_counter() - started < 5
            broken.close()
        assert list(second.map(square, range(4))) == [0, 1, 4, 9]


def plus(model, job):
    return job[0] + job[1]


def test_threads_share_a_kept_pool(tiny_model):
    """Four threads map over one kept pool at once, as a server's threads would: each gets its own results, in
    order (one thread at a time takes in the workers' messages, for all)."""
    got = {}
    with Workers(tiny_model, 2) as pool:

        def run(k):
            got[k] = list(pool.map(plus, [(k * 1000, i) for i in range(300)]))

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert got == {k: [k * 1000 + i for i in range(300)] for k in range(4)}


def test_more_workers_than_the_memory_holds_are_refused_before_any_fork(tiny_model, monkeypatch):
    """--threads 1000 forked until the out-of-memory killer took processes (this run's, and others')."""
    from paraphrastic import workers

    monkeypatch.setattr(workers, "available_memory", lambda: 3 * workers.WORKER_BYTES)
    forks = []
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or pytest.fail("forked"))
    with pytest.raises(WorkerError, match="4 worker processes need at least 0.2 GiB.*fewer --threads"):
        Workers(tiny_model, 4).start()
    assert not forks
