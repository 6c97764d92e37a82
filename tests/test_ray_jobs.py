"""Ray jobs one can trust (commit.py, ray_engine.py): a folder claimed by one run, published with a manifest
written last, a killed driver resumed to the straight run's rows, each input once, nothing left behind by an
error or a kill, and the feedback of the local commands. The drivers run as processes of their own, joined to
the tests' shared local Ray (conftest.local_ray: killing one leaves it up), or start their own where that is the
point."""

import ast
import contextlib
import gzip
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import dead_pid, generated_sentences, need

from paraphrastic import commit, embed_sentences, mine_bitext, score_sentence_pairs

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray-jobs")]
ROOT = Path(__file__).resolve().parent.parent
FINISHED = sorted([commit.DONE, commit.MANIFEST])  # what a finished folder holds beside its parts


@pytest.fixture
def inputs(tmp_path) -> list[Path]:
    """12 small text files (one work item each), 2,400 lines in all."""
    folder = tmp_path / "in"
    folder.mkdir()
    sentences = generated_sentences(2400, seed=21)
    files = []
    for i in range(12):
        path = folder / f"t{i:02d}.txt"
        path.write_text("".join(s + "\n" for s in sentences[i * 200 : (i + 1) * 200]))
        files.append(path)
    return files


def embed_cmd(model: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "paraphrastic.embed_sentences", "--engine", "ray", "--load-file", str(model),
            "--output-dir", str(out), *args]  # fmt: skip


def rows_of(folder: Path) -> tuple[list, bytes]:
    """(file, line) keys and the vector bytes of a finished folder, read through its manifest."""
    from paraphrastic.ray_engine import read_parts

    table = read_parts(folder)
    keys = list(zip(table.column("file").to_pylist(), table.column("line").to_pylist(), strict=True))
    return keys, table.column("vector").combine_chunks().flatten().to_numpy().tobytes()


def straight(address, model, files, out, *extra: str) -> tuple[list, bytes]:
    args = ["--engine", "ray", "--address", address, "--input", *map(str, files), "--output-dir", str(out), *extra]
    assert embed_sentences.main([*args, "--load-file", str(model), "--quiet"]) == 0
    return rows_of(out)


def ray_family(driver: int) -> list:
    """The processes of the Ray a driver started: its descendants (GCS, raylet, Ray's helpers and agents, the
    actors' workers), as psutil processes (psutil comes with Ray)."""
    import psutil

    return psutil.Process(driver).children(recursive=True)


def title(proc) -> str:
    """A process's command line ('' once it is gone)."""
    import psutil

    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def alive_of(family: list, raylets: set[int]) -> list[str]:
    """Which of a Ray's processes live on, and any other process its raylet started (found by its environment)."""
    import psutil

    found = {p.pid: p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}
    for proc in psutil.process_iter():
        try:
            env = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(f"RAY_RAYLET_PID={pid}".encode() in env for pid in raylets):
            found[proc.pid] = proc
    return [f"{pid} {title(proc)[:80]}" for pid, proc in found.items() if proc.is_running()]


def test_a_driver_killed_at_random_moments_resumes_to_the_straight_run(local_ray, tiny_model_file, inputs, tmp_path):
    """Fault injection: 6 seeded runs, each driver SIGKILLed at a random moment of its own sixth of a run's span
    (stratified: every sixth hit once, as 10 uniform moments hit each at least once, in 60% of the time), then
    resumed with --resume on one worker: every output equals the straight run's on two, key for key and vector for
    vector, and until it is resumed no reader takes a folder for complete."""
    began = time.perf_counter()
    want = straight(local_ray, tiny_model_file, inputs, tmp_path / "straight")
    span = time.perf_counter() - began + 2.0  # a driver's own start: Python, the imports, joining the cluster
    kills = 6
    for seed in range(kills):
        out = tmp_path / f"killed-{seed}"
        cmd = embed_cmd(tiny_model_file, out, "--address", local_ray, "--quiet", "--input", *map(str, inputs))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3 + (span - 0.3) * (seed + random.Random(seed).random()) / kills)
        proc.kill()
        proc.wait()
        if out.exists() and not (out / commit.DONE).exists():
            with pytest.raises(Exception, match="has not finished|no _SUCCESS"):
                rows_of(out)
        args = ["--engine", "ray", "--address", local_ray, "--input", *map(str, inputs), "--output-dir", str(out)]
        resume = ["--load-file", str(tiny_model_file), "--quiet", "--resume", "--threads", "1"]  # 1 actor: 2 s less
        assert embed_sentences.main([*args, *resume]) == 0
        assert rows_of(out) == want, f"seed {seed}"
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith("part-")) == FINISHED


def folder_readers() -> dict:
    """How people read a folder of Parquet parts: each reader's row count of a folder (or its error)."""
    duckdb, pl, pd, ds = need("duckdb"), need("polars"), need("pandas"), need("pyarrow.dataset")
    ray = need("ray")
    sql = "select count(*) from read_parquet('{}')"
    return {
        "pyarrow.dataset": lambda out: ds.dataset(out, format="parquet").count_rows(),
        "pandas": lambda out: len(pd.read_parquet(out)),
        "duckdb folder": lambda out: duckdb.sql(sql.format(out)).fetchall()[0][0],
        "duckdb *.parquet": lambda out: duckdb.sql(sql.format(f"{out}/*.parquet")).fetchall()[0][0],
        "polars folder": lambda out: pl.scan_parquet(out).select(pl.len()).collect().item(),
        "polars **/*.parquet": lambda out: pl.scan_parquet(f"{out}/**/*.parquet").select(pl.len()).collect().item(),
        "ray data": lambda out: ray.data.read_parquet(str(out)).count(),
    }


def test_every_common_reader_reads_a_finished_folder_whole_and_no_staged_row(
    local_ray, tiny_model_file, inputs, tmp_path
):
    """DuckDB, polars, pandas, pyarrow and Ray Data, on the folder and on globs: a finished folder gives every row
    exactly once, and a folder whose run was stopped with items committed gives 0 rows or an error, never a row of
    its staged parts."""
    readers = folder_readers()
    want = straight(local_ray, tiny_model_file, inputs, tmp_path / "done")
    assert sorted(p.name for p in (tmp_path / "done").iterdir() if not p.name.startswith("part-")) == FINISHED
    for name, count in readers.items():
        assert count(tmp_path / "done") == len(want[0]), name
    stopped = tmp_path / "stopped"
    cmd = embed_cmd(tiny_model_file, stopped, "--address", local_ray, "--quiet", "--input", *map(str, inputs))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not list((stopped / commit.STAGING / "items").glob("*.json")) and proc.poll() is None:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert list(stopped.glob(f"{commit.STAGING}/*{commit.STAGED}")) and not (stopped / commit.DONE).exists()
    for name, count in readers.items():
        try:
            rows = count(stopped)
        except Exception:  # a refusal is a right answer too
            continue
        assert rows == 0, name


def test_a_gz_input_gives_the_bar_a_total_of_items(local_ray, tiny_model_file, inputs, tmp_path, capsys):
    """Lines of a .gz are known only as it is read: the bar then counts work items, whose total is known."""
    packed = tmp_path / "t.txt.gz"
    packed.write_bytes(gzip.compress(inputs[0].read_bytes()))
    args = ["--engine", "ray", "--address", local_ray, "--input", str(packed), str(inputs[1]), "--output-dir"]
    assert embed_sentences.main([*args, str(tmp_path / "o"), "--load-file", str(tiny_model_file)]) == 0
    assert "2/2 [" in capsys.readouterr().err.replace(" item", "")


def test_two_runs_started_together_into_one_folder_one_wins(local_ray, tiny_model_file, inputs, tmp_path):
    out = tmp_path / "shared"
    cmds = [embed_cmd(tiny_model_file, out, "--address", local_ray, "--quiet", "--input", *map(str, files))
            for files in (inputs[:6], inputs[6:])]  # fmt: skip
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for c in cmds]  # fmt: skip
    results = [(p.wait(), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    winner = [code for code, _ in results].index(0)
    error = results[1 - winner][1].strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"error: {out}: ") and "output-dir" in error[0]
    keys, _ = rows_of(out)
    mine = inputs[:6] if winner == 0 else inputs[6:]
    assert keys == [(str(f), line) for f in mine for line in range(200)]


def test_options_the_engine_would_not_follow_are_one_usage_error(tmp_path, capsys):
    """--engine ray with an option its actors would not follow (a sentencepiece file, a device, a shard, a local
    output, job sizes): one usage error naming each, before any work, where a run used to ignore them."""
    text = tmp_path / "a.txt"
    text.write_text("a man\n")
    ray = ["--engine", "ray", "--input", str(text), "--output-dir", str(tmp_path / "o")]
    mine = ["--engine", "ray", "--source", str(text), "--target", str(text), "--output-file", str(tmp_path / "m.tsv")]
    cases = [
        (embed_sentences.main, [*ray, "--sp-model", "x.model", "--shard", "1"], "--shard, --sp-model"),
        (embed_sentences.main, [*ray, "--output-file", "v.npy", "--device", "auto"], "--output-file, --device"),
        (score_sentence_pairs.main, [*ray, "--chunk-lines", "100"], "--chunk-lines"),
        (mine_bitext.main, [*mine, "--device", "cuda", "--sp-model", "x.model"], "--sp-model, --device"),
    ]
    for main, args, named in cases:
        with pytest.raises(SystemExit) as stop:
            main(args)
        err = capsys.readouterr().err.strip().splitlines()
        why = "its actors read our model files, on their CPUs, and write Parquet parts to --output-dir"
        assert stop.value.code == 2, err
        assert err[-1].endswith(f"error: --engine ray does not take {named} ({why}): leave them out"), err
    for main, args in ((embed_sentences.main, ray), (mine_bitext.main, mine)):  # checked on the model it loads
        assert main([*args, "--truncate-dim", "300"]) == 2
        assert capsys.readouterr().err == "error: --truncate-dim 300 is more than the model's 256 values a row\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def change(action: str, files: list[Path], out: Path, rng: random.Random) -> None:
    """One fault of the injection test, done while the run is under way."""
    victim = rng.choice(files)
    if action == "truncate an input":
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size // 2)
    elif action == "rewrite an input in place":  # the same size and modification time, other content
        stat, data = victim.stat(), victim.read_bytes()
        victim.write_bytes(data.upper() if data != data.upper() else data.lower())
        os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif action == "swap two inputs":
        other = rng.choice([f for f in files if f != victim])
        a, b = victim.read_bytes(), other.read_bytes()
        victim.write_bytes(b), other.write_bytes(a)
    else:  # a staged part cut short, or its bytes flipped in place (same size and modification time)
        staged = sorted((out / commit.STAGING).glob(f"*{commit.STAGED}"))
        part = rng.choice(staged)
        data = bytearray(part.read_bytes())
        if action == "cut a staged part":
            part.write_bytes(data[: len(data) // 2])
        else:
            stat = part.stat()
            data[100:164] = bytes(255 - x for x in data[100:164])
            part.write_bytes(data)
            os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_inputs_or_parts_changed_at_random_moments_never_publish_wrong_rows(
    local_ray, tiny_model_file, inputs, tmp_path, monkeypatch
):
    """Fault injection: 10 seeded runs, each changing an input (truncated, rewritten in place to the same size and
    time, two swapped) or a staged part (cut, or its bytes flipped in place, size and time kept) after a random commit:
    each run ends refused, or resumed (--resume) to the straight run's rows; never `_SUCCESS` over wrong rows."""
    inputs = inputs[:6]  # 6 work items a run: 10 runs and 4 resumes in well under a minute
    want = straight(local_ray, tiny_model_file, inputs, tmp_path / "straight", "--threads", "1")
    actions = ["truncate an input", "rewrite an input in place", "swap two inputs", "cut a staged part",
               "flip a staged part's bytes"]  # fmt: skip
    real_commit, ends = commit.Job.commit, []
    for seed in range(10):
        rng = random.Random(seed)
        action, at = actions[seed % len(actions)], rng.randrange(1, len(inputs) - 1)
        folder = tmp_path / f"in-{seed}"
        folder.mkdir()
        for f in inputs:
            shutil.copyfile(f, folder / f.name)
        files = [folder / f.name for f in inputs]
        out, commits = tmp_path / f"o-{seed}", []

        def commit_then_change(job, record, files=files, out=out, commits=commits, action=action, at=at, rng=rng):
            real_commit(job, record)
            commits.append(record["item"])
            if len(commits) == at:
                change(action, files, out, rng)

        monkeypatch.setattr(commit.Job, "commit", commit_then_change)
        args = ["--engine", "ray", "--address", local_ray, "--input", *map(str, files), "--output-dir", str(out),
                "--load-file", str(tiny_model_file), "--quiet", "--threads", "1"]  # fmt: skip
        code = embed_sentences.main(args)
        monkeypatch.setattr(commit.Job, "commit", real_commit)
        if "staged part" in action:  # refused before publishing, then resumed: the damaged part's item runs again
            assert code != 0 and not (out / commit.DONE).exists(), (seed, action)
            assert embed_sentences.main([*args, "--resume"]) == 0
            keys, vectors = rows_of(out)
            assert keys == [(str(folder / k[0].rsplit("/", 1)[1]), k[1]) for k in want[0]] and vectors == want[1]
            ends.append("resumed")
        else:
            assert code == 2 and not (out / commit.DONE).exists(), (seed, action)
            assert (out / commit.STAGING).is_dir() or not commits  # what was committed is kept
            ends.append("refused")
    assert ends.count("resumed") == 4 and ends.count("refused") == 6


def test_a_claimed_folder_is_refused_while_its_run_holds_it(tmp_path):
    need("pyarrow")  # the manifest is a Parquet file
    spec = {"kind": "embed", "inputs": [], "model": {}, "options": {}, "items": []}
    job = commit.Job.open(tmp_path / "o", spec)
    for resume in (False, True):
        with pytest.raises(commit.InputError, match="in use by run"):
            commit.Job.open(tmp_path / "o", spec, resume=resume)
    job.release(keep=True)  # as a killed run leaves it
    with pytest.raises(commit.InputError, match="unfinished work .* --resume"):
        commit.Job.open(tmp_path / "o", spec)
    with pytest.raises(commit.InputError, match="other inputs"):
        commit.Job.open(tmp_path / "o", spec | {"inputs": [{"path": "x"}]}, resume=True)
    job = commit.Job.open(tmp_path / "o", spec, resume=True)
    job.publish({}, {})
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == FINISHED


def test_another_runs_attempt_at_the_claim_is_not_content(tmp_path):
    """Two runs started together: the one that got the claim found the other's claim temporary in the folder,
    called the folder not empty and gave up, while the other found the claim unlocked and called it a stopped run
    (the fresh-clone CI once, both refused). The winner now takes no attempt at the claim for content."""
    need("pyarrow")  # the manifest is a Parquet file
    spec = {"kind": "embed", "inputs": [], "model": {}, "options": {}, "items": []}
    out = tmp_path / "o"
    out.mkdir()
    attempt = out / f".{commit.CLAIM}.{os.getpid()}.0123456789ab.tmp"  # a live run's, between its open and link
    attempt.write_text("{}")
    job = commit.Job.open(out, spec)
    attempt.unlink()  # as that run does once its link fails
    job.publish({}, {})
    assert sorted(p.name for p in out.iterdir()) == FINISHED
    for name in ("x.12345678.tmp", f".{commit.CLAIM}.backup"):  # anything else is content, as before
        (tmp_path / name).mkdir()
        (tmp_path / name / name).write_text("mine")
        with pytest.raises(commit.InputError, match="is not empty"):
            commit.Job.open(tmp_path / name, spec)


def test_a_run_resumed_after_a_kill_mid_manifest_or_mid_claim_leaves_only_its_output(tmp_path):
    """A driver killed while it wrote its manifest or _SUCCESS (their temporaries, never renamed) or its claim (never
    linked): the run
    that resumes it publishes the output, and nothing of the killed one is left beside it (the fresh-clone CI once
    found a `._SUCCESS.PID.*.tmp` there)."""
    need("pyarrow")  # the manifest is a Parquet file
    spec = {"kind": "embed", "inputs": [], "model": {}, "options": {}, "items": []}
    job = commit.Job.open(tmp_path / "o", spec)
    job.release(keep=True)  # as a killed run leaves it
    dead = dead_pid()
    (tmp_path / "o" / f".{commit.MANIFEST}.{dead}.abcd1234.tmp").write_text("PAR1 half")
    (tmp_path / "o" / f".{commit.DONE}.{dead}.abcd1234.tmp").write_text("")
    (tmp_path / "o" / f".{commit.CLAIM}.{dead}.{'f' * 32}.tmp").write_text("{}")
    commit.Job.open(tmp_path / "o", spec, resume=True).publish({}, {})
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == FINISHED


def test_resume_clears_what_a_run_killed_after_its_manifest_left(tmp_path, monkeypatch):
    """A driver killed between writing _SUCCESS and removing its claim and staging: the output reads whole, and
    --resume says it is finished and clears the rest (not while that run still holds its claim)."""
    need("pyarrow")  # the manifest is a Parquet file
    spec = {"kind": "embed", "inputs": [], "model": {}, "options": {}, "items": []}
    job = commit.Job.open(tmp_path / "o", spec)
    with monkeypatch.context() as patched:
        patched.setattr(commit.Job, "release", lambda self, keep: None)  # the kill, right after the manifest
        job.publish({}, {})
    left = sorted([commit.CLAIM, commit.DONE, commit.MANIFEST, commit.STAGING])
    for alive in (True, False):
        if not alive:
            job.handle.close()  # the process is gone, and its lock with it
        with pytest.raises(commit.Finished, match="finished already"):
            commit.Job.open(tmp_path / "o", spec, resume=True)
        assert sorted(p.name for p in (tmp_path / "o").iterdir()) == (left if alive else FINISHED)
    assert commit.manifest(tmp_path / "o")["rows"] == 0


def test_each_file_is_read_once_whatever_names_reach_it(local_ray, tiny_model_file, inputs, tmp_path, monkeypatch):
    monkeypatch.chdir(inputs[0].parent)
    names = ["t00.txt", "t0*.txt", "./t00.txt", str(inputs[0]), "../in/t01.txt"]
    keys, _ = straight(local_ray, tiny_model_file, names, tmp_path / "o", "--threads", "1")  # one actor: 2 s less
    assert len(keys) == len(set(keys)) == 10 * 200


def test_outputs_and_foreign_parquet_are_refused_as_inputs_before_any_work(local_ray, tiny_model_file, inputs,
                                                                           tmp_path, capsys):  # fmt: skip
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = inputs[0].parent
    straight(local_ray, tiny_model_file, inputs[:2], d / "o1", "--threads", "1")  # one actor a run: 2 s less each
    capsys.readouterr()
    args = ["--engine", "ray", "--address", local_ray, "--load-file", str(tiny_model_file), "--quiet", "--threads", "1"]
    assert embed_sentences.main([*args, "--input", str(d / "o1" / "*"), "--output-dir", str(d / "o2")]) == 2
    assert "a part of the output folder" in capsys.readouterr().err and not (d / "o2").exists()
    assert embed_sentences.main([*args, "--input", str(d / "*"), "--output-dir", str(d / "o2")]) == 0  # o1 left out
    capsys.readouterr()
    assert rows_of(d / "o2")[0] == [(str(f), line) for f in inputs for line in range(200)]
    pq.write_table(pa.table({"sentence": ["a man"]}), tmp_path / "t.parquet")
    assert embed_sentences.main([*args, "--input", str(tmp_path / "t.parquet"), "--output-dir", str(d / "o3")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no column 'text' (it has: sentence)" in err[0] and "--text-column" in err[0]
    assert not (d / "o3").exists()


def test_errors_leave_no_folder_and_no_parts(local_ray, tiny_model_file, tmp_path, capsys, monkeypatch):
    (tmp_path / "p.tsv").write_text("".join(f"a man {i}\ta woman\n" for i in range(100)) + "no tab here\n")
    args = ["--engine", "ray", "--address", local_ray, "--threads", "1", "--input", str(tmp_path / "p.tsv"),
            "--output-dir"]  # fmt: skip
    assert score_sentence_pairs.main([*args, str(tmp_path / "o"), "--load-file", str(tiny_model_file)]) == 2
    err = capsys.readouterr().err.strip().replace("\r", "\n").splitlines()
    assert err[-1].startswith(f"error: {tmp_path / 'p.tsv'}:101: expected")
    assert not (tmp_path / "o").exists()
    assert score_sentence_pairs.main([*args, str(tmp_path / "o"), "--load-file", str(tiny_model_file),
                                      "--skip-bad-lines"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert f"1 bad lines (not exactly one tab) scored nan: line {tmp_path / 'p.tsv'}:101" in err
    monkeypatch.setitem(sys.modules, "ray", None)
    assert embed_sentences.main([*args, str(tmp_path / "o2")]) == 2
    assert 'pip install "paraphrastic[ray]"' in capsys.readouterr().err and not (tmp_path / "o2").exists()


def test_an_address_where_nothing_answers_is_one_error_at_once(tiny_model_file, inputs, tmp_path):
    import socket

    need("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # a port nobody listens on once closed
    cmd = embed_cmd(tiny_model_file, tmp_path / "o", "--address", f"127.0.0.1:{port}", "--input", str(inputs[0]))
    began = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "no Ray cluster answers there" in err[0]
    assert time.perf_counter() - began < 20
    assert not (tmp_path / "o").exists()


def test_an_address_that_is_not_ray_and_an_address_space_limit_are_one_error_in_seconds(tiny_model_file, inputs,
                                                                                        tmp_path):  # fmt: skip
    """A port that answers but is not Ray (once 150 s of silence and Ray's C++ warnings), and a local Ray under
    `prlimit --as` (its actors died; the driver waited inside ray.init): one line each, within seconds."""
    import socket
    import threading

    need("ray")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()

        def answer():  # an HTTP server's answer to anything
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = server.accept()
                    conn.recv(1024), conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"), conn.close()

        threading.Thread(target=answer, daemon=True).start()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        cases = {
            "not Ray": (
                embed_cmd(tiny_model_file, tmp_path / "o", "--address", address, "--quiet", "--input", str(inputs[0])),
                "something answers there, but not Ray",
            ),  # fmt: skip
            "limit": (
                [
                    "prlimit",
                    f"--as={8 << 30}",
                    *embed_cmd(tiny_model_file, tmp_path / "o", "--quiet", "--input", str(inputs[0])),
                ],
                "ulimit -v",
            ),  # fmt: skip
        }
        for name, (cmd, said) in cases.items():
            began = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            err = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(err) == 1 and said in err[0], (name, proc.stderr[-2000:])
            assert time.perf_counter() - began < 30 and not (tmp_path / "o").exists(), name


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_local_ray_is_gone_when_its_driver_is_killed(tiny_model_file, tmp_path, how):
    """A driver with a Ray of its own, killed once its actors run: no Ray process of it alive within 5 s; a SIGTERM
    exits 143 saying what was kept; the progress bar and no Ray warning on stderr."""
    need("ray")  # and psutil, which comes with it
    path = tmp_path / "big.txt"
    path.write_text("".join(s + "\n" for s in generated_sentences(2000, seed=22)) * 200)
    proc = subprocess.Popen(embed_cmd(tiny_model_file, tmp_path / "o", "--input", str(path), "--threads", "1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 60
    family = []
    while not any("ray::Parts" in title(p) for p in family):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
        family = ray_family(proc.pid)
    raylets = {p.pid for p in family if p.name() == "raylet"}
    proc.send_signal(how)
    code, err = proc.wait(), proc.stderr.read()
    gone_by = time.time() + 5
    while (alive := alive_of(family, raylets)) and time.time() < gone_by:
        time.sleep(0.2)
    time.sleep(0.5)  # and none comes back
    assert raylets and alive == [] and alive_of(family, raylets) == []
    if how == signal.SIGTERM:
        assert code == 143 and "interrupted;" in err.splitlines()[-1] and "embed:" in err
        assert "WARNING" not in err and "Token authentication" not in err


def test_a_parts_columns_import_neither_pandas_nor_arrows_compute():
    """An actor's first part cost it 1-2.6 s of imports (pa.array imports pandas, a cast pyarrow.compute), which
    the stall clock counted: a loaded machine took healthy actors for hung. The columns are built from their bytes,
    equal to pa.array's, in a fresh Python."""
    need("pyarrow")
    code = """if True:
        import sys
        import numpy as np
        from paraphrastic.ray_engine import keyed, numeric
        tables = [keyed("dir/é.txt", 7, 3).append_column("v", numeric(np.arange(3, dtype=t))) for t in ("f4", "f2", "i1")]
        assert not {"pandas", "pyarrow.compute"} & set(sys.modules), "imported"
        import pyarrow as pa
        for table, t in zip(tables, ("f4", "f2", "i1")):
            table.validate(full=True)
            want = pa.table({"file": pa.array(["dir/é.txt"] * 3, pa.string()), "line": pa.array(np.arange(7, 10)),
                             "v": pa.array(np.arange(3, dtype=t))})
            assert table.equals(want), (table, want)
    """
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_the_engine_imports_no_command_module():
    """ray_engine and commit sit below the commands: the commands hand them what they need."""
    commands = {"embed_sentences", "score_sentence_pairs", "mine_bitext", "train", "evaluate", "demo", "interop"}
    for module in ("ray_engine.py", "commit.py"):
        tree = ast.parse((ROOT / module).read_text())
        names = {a.name.split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        names |= {n.module.split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & commands, module


def test_a_lost_node_the_run_finishes_on_the_other(tiny_model_file, tmp_path):
    """Two nodes on this machine (Ray's own multi-node test cluster); the node running half the actors is
    removed mid-run: the run finishes on the other, every (file, line) exactly once, vectors as a straight run."""
    ray = need("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    files = []
    for i in range(8):
        path = tmp_path / f"n{i}.txt"
        path.write_text("".join(s + "\n" for s in generated_sentences(3000, seed=30 + i)))
        files.append(path)
    quick = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000, "health_check_failure_threshold": 4}
    node_cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "_system_config": quick}
    )  # a lost node seen soon
    doomed = node_cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    node_cluster.wait_for_nodes()
    try:
        out = tmp_path / "o"
        proc = subprocess.Popen(embed_cmd(tiny_model_file, out, "--address", node_cluster.address,
                                          "--input", *map(str, files)), stderr=subprocess.PIPE, text=True,
                                env=os.environ | {"RAY_LOG_LEVEL": "info"})  # fmt: skip
        deadline = time.time() + 60
        while not list((out / commit.STAGING / "items").glob("*.json")):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.05)
        node_cluster.remove_node(doomed, allow_graceful=False)
        try:
            assert proc.wait(timeout=180) == 0, proc.stderr.read()
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(proc.communicate()[1][-3000:]) from None
        keys, vectors = rows_of(out)
        assert keys == [(str(f), line) for f in files for line in range(3000)]
    finally:
        node_cluster.shutdown()
    one = tmp_path / "one.npy"
    whole = tmp_path / "all.txt"
    whole.write_text("".join(f.read_text() for f in files))
    args = ["--sentence-file", str(whole), "--output-file", str(one), "--load-file", str(tiny_model_file), "--quiet"]
    assert embed_sentences.main(args) == 0
    assert np.load(one).tobytes() == vectors
