"""Faults, bad input and untrusted files (issue 10): killed runs, a full disk, NaN losses, damaged
checkpoints, shards and sentencepiece models, messy text, and property-based invariants of the encoder.

Every failure must be one `error: FILE[:LINE]: what is wrong (what to do)` line with exit status 2 (3 for
a NaN stop), no traceback, and no output that looks complete but is not."""

import json
import math
import os
import random
import re
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT, dead_pid, generated_sentences, sp_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraphrastic import (
    checkpoint,
    embed_sentences,
    evaluate,
    fileio,
    load_encoder,
    models,
    resume,
    run_setup,
    score_sentence_pairs,
    shards,
    static,
    train,
    train_config,
)
from paraphrastic.options import STORED_PRECISIONS
from paraphrastic.pairs import tokenize_pairs

PROPERTY = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- helpers


def run_script(
    script: str, *args, env: dict | None = None, file_limit: int | None = None
) -> subprocess.CompletedProcess:
    """Run one of the scripts in a fresh interpreter; `file_limit` caps the size of any file it writes."""
    preexec = None
    if file_limit is not None:

        def preexec():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    environ = os.environ | (env or {})
    cmd = [sys.executable, str(ROOT / script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=environ, preexec_fn=preexec)


def run_main(module, capsys, *args) -> subprocess.CompletedProcess:
    """A script's main run in this process (faster than a fresh interpreter), as a CompletedProcess."""
    status = module.main([str(a) for a in args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, captured.out, captured.err)


def assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str, status: int = 2) -> str:
    """The run failed with `status`, no traceback, and its last stderr line is `error: ...` naming `fragments`."""
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and [x for x in done.stderr.splitlines() if "error" in x] == [line], done.stderr
    for fragment in fragments:
        assert fragment in line, line
    return line


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


def train_args(pairs_file: Path, sp_file: Path, out: Path, *extra) -> list[str]:
    return [
        "--train-file", str(pairs_file), "--sp-model", str(sp_file), "--output-dir", str(out), "--dim", "16",
        "--batch-size", "8", "--megabatch-size", "3", "--megabatch-anneal", "2", "--threads", "1",
        "--log-every", "5", "--dropout", "0.1", *map(str, extra),
    ]  # fmt: skip


def weights(path: Path) -> torch.Tensor:
    return models.load_model(path).embedding.weight.detach()


# ----------------------------------------------------------------------------- killed runs


def assert_checkpoints_complete(out: Path) -> None:
    """Whatever a kill left behind loads completely: no checkpoint on disk is ever partial."""
    if (out / "model.pt").exists():
        assert torch.isfinite(weights(out / "model.pt")).all()
    if (out / "resume.pt").exists():
        assert resume.load_resume_state(out)["position"]["step"] >= 1


def identity(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of a file, which an atomic rename changes; None when absent."""
    return (path.stat().st_ino, path.stat().st_mtime_ns) if path.exists() else None


def test_training_killed_at_random_points_resumes_to_the_same_weights(sp_file, pairs_file, tmp_path):
    """SIGKILL at random moments (saving every other step, so kills often land mid-save), then resume. A kill
    comes within 15 steps of a run's first save, at the straight run's pace: mid-run on a machine of any speed."""
    common = ["--max-steps", "60", "--save-every", "2"]
    start = time.monotonic()
    assert train.main(train_args(pairs_file, sp_file, tmp_path / "straight", *common)) == 0
    step = (time.monotonic() - start) / 60  # seconds a step, with its start-up spread over them
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    out = tmp_path / "killed"
    kills = 0
    for trial in range(4):
        args = train_args(pairs_file, sp_file, out, *common, *(["--resume"] if (out / "resume.pt").exists() else []))
        if trial == 3:  # the last run goes to the end (in this process: it is not killed)
            assert train.main(args) == 0
            break
        cmd = [sys.executable, str(ROOT / "train.py"), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        saved, deadline = identity(out / "resume.pt"), time.monotonic() + 60
        while identity(out / "resume.pt") == saved and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # until this run has saved once: it is training
        time.sleep(rng.uniform(0.0, 15 * step))
        proc.send_signal(signal.SIGKILL)
        kills += proc.wait() == -signal.SIGKILL
        assert_checkpoints_complete(out)
    assert kills >= 1, f"no run was killed mid-way (seed {seed})"
    assert temps(out) == [], "the run after a kill removes the temporary files the kill left"
    assert torch.equal(weights(tmp_path / "straight" / "model.pt"), weights(out / "model.pt")), f"seed {seed}"


def test_stale_temporary_files_are_removed_on_the_next_run(sp_file, pairs_file, tiny_model_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    dead = 2**22 + 7  # no such process
    stale = [out / f".resume.pt.{dead}.x1y2z3w4.tmp", out / f".model.pt.{dead}.abc_1234.tmp"]
    stale.append(out / f".{train_config.SP_INPUT}.{dead}.q1w2e3r4.tmp")
    others = [out / ".notes.txt.keep.tmp", out / ".model.pt.mybackup.tmp"]  # not the run's, or not named by it
    for path in [*stale, *others]:
        path.write_bytes(b"partial")
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "2")) == 0
    assert temps(out) == sorted(p.name for p in others)
    (tmp_path / "in.txt").write_text("a line\n")
    (tmp_path / f".out.npy.{dead}.k3k3k3k3.tmp").write_bytes(b"partial")
    (tmp_path / ".out.npy.mybackup.tmp").write_text("a user's notes")  # a name of the same shape, not ours
    args = [
        "--sentence-file",
        tmp_path / "in.txt",
        "--load-file",
        tiny_model_file,
        "--output-file",
        tmp_path / "out.npy",
    ]
    assert embed_sentences.main([*map(str, args), "--quiet"]) == 0
    assert not (tmp_path / f".out.npy.{dead}.k3k3k3k3.tmp").exists()
    assert (tmp_path / ".out.npy.mybackup.tmp").read_text() == "a user's notes"


def test_every_atomic_write_removes_what_killed_writers_of_its_file_left(tmp_path):
    """A writer killed mid-write leaves `.NAME.PID.XXXXXXXX.tmp` beside NAME: the next write of NAME removes it, by
    any command (mine's pairs, evaluate's --json, an export, a teacher's targets), and keeps what is not a dead
    writer's (a live one's, a user's file of a like name)."""
    dead, alive = dead_pid(), os.getpid()
    left = [tmp_path / f".out.tsv.{dead}.abcd_123.tmp"]
    kept = [tmp_path / f".out.tsv.{alive}.abcd_123.tmp", tmp_path / ".out.tsv.mybackup.tmp"]
    for path in left + kept:
        path.write_text("partial")
    with fileio.atomic_output(tmp_path / "out.tsv", "w") as f:
        f.write("rows")
    assert sorted(temps(tmp_path)) == sorted(p.name for p in kept)
    assert (tmp_path / "out.tsv").read_text() == "rows"


def test_atomic_output_fsyncs_before_the_rename(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync"))
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append("replace") or real_replace(a, b))
    with fileio.atomic_output(tmp_path / "f.bin") as f:
        f.write(b"data")
    assert calls[:2] == ["fsync", "replace"] and calls[2:] == ["fsync"]  # the file, the rename, the directory
    with pytest.raises(RuntimeError), fileio.atomic_output(tmp_path / "f.bin") as f:
        f.write(b"half")
        raise RuntimeError("killed")
    assert (tmp_path / "f.bin").read_bytes() == b"data" and temps(tmp_path) == []


@pytest.mark.parametrize("script", ["embed_sentences.py", "score_sentence_pairs.py"])
def test_killed_embedding_or_scoring_leaves_no_plausible_output(script, tiny_model_file, tmp_path):
    sentences = generated_sentences(1000, seed=5) * 100
    embed = script == "embed_sentences.py"
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{s}\n" if embed else f"{s}\t{s[::-1]}\n" for s in sentences))
    out = tmp_path / ("out.npy" if embed else "out.tsv")
    args = ["--sentence-file" if embed else "--sentence-pair-file", src, "--load-file", tiny_model_file]
    args += ["--output-file", out, "--quiet", "--chunk-lines", "5000", "--batch-size", "1000"]
    proc = subprocess.Popen([sys.executable, str(ROOT / script), *map(str, args)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not temps(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(random.uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not out.exists(), "a killed run leaves no output file"
    assert len(temps(tmp_path)) == 1
    done = run_script(script, *args)
    assert done.returncode == 0, done.stderr
    assert temps(tmp_path) == []
    rows = np.load(out).shape[0] if embed else out.read_bytes().count(b"\n")
    assert rows == len(sentences)


# ----------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted in the test folder (root can mount one), or None where mounting is refused."""
    folder = tmp_path / "tmpfs"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        yield None
        return
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def run_with_little_room(disk: Path | None, room: int, script: str, *args) -> subprocess.CompletedProcess:
    """Run `script` with about `room` bytes left to write: the tmpfs filled up to that, or, without a tmpfs,
    a file size limit (EFBIG instead of ENOSPC, through the same code path)."""
    if disk is None:
        return run_script(script, *args, file_limit=room)
    stats = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(stats.f_bavail * stats.f_frsize - room, 0))
    try:
        return run_script(script, *args)
    finally:
        filler.unlink()


def where(disk: Path | None, tmp_path: Path) -> Path:
    return disk if disk is not None else tmp_path / "out"


FULL = ("no space left on device", "file too large")


def assert_full_disk_error(done: subprocess.CompletedProcess, path: Path) -> None:
    line = assert_one_line_error(done, f"{path}: ")
    assert any(reason in line for reason in FULL) and "free some space" in line, line


@pytest.mark.parametrize("script", ["embed_sentences.py", "score_sentence_pairs.py"])
def test_full_disk_is_a_clear_error_and_keeps_the_previous_output(
    script, small_disk, tiny_model_file, tmp_path, capsys
):
    folder = where(small_disk, tmp_path)
    folder.mkdir(exist_ok=True)
    embed = script == "embed_sentences.py"
    out = folder / ("out.npy" if embed else "out.tsv")
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text("a man\ta woman\n" if not embed else "a man\n")
    big.write_text("".join(f"{s}\t{s}\n" if not embed else f"{s}\n" for s in generated_sentences(20_000, seed=1)))
    flag = "--sentence-file" if embed else "--sentence-pair-file"
    base = ["--load-file", tiny_model_file, "--output-file", out, "--quiet"]
    module = embed_sentences if embed else score_sentence_pairs
    assert run_main(module, capsys, flag, small, *base).returncode == 0
    before = out.read_bytes()
    done = run_with_little_room(small_disk, 64 * 1024, script, flag, big, *base)
    assert_full_disk_error(done, out)
    assert out.read_bytes() == before and temps(folder) == []


def test_full_disk_while_embedding_is_not_a_crash_under_a_file_size_limit(tiny_model_file, tmp_path):
    """The memory-mapped .npy is allocated up front: no SIGBUS when the file system cannot hold it."""
    (tmp_path / "in.txt").write_text("\n".join(generated_sentences(5000, seed=2)) + "\n")
    out = tmp_path / "out.npy"
    args = ["--sentence-file", tmp_path / "in.txt", "--load-file", tiny_model_file, "--output-file", out, "--quiet"]
    assert_full_disk_error(run_script("embed_sentences.py", *args, file_limit=100_000), out)
    assert not out.exists() and temps(tmp_path) == []


def test_full_disk_during_training_keeps_the_last_checkpoint(small_disk, sp_file, pairs_file, tmp_path):
    out = where(small_disk, tmp_path) / "run"
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "4")) == 0
    before = {name: (out / name).read_bytes() for name in ("resume.pt", "model.pt")}
    args = train_args(pairs_file, sp_file, out, "--max-steps", "8", "--resume")
    done = run_with_little_room(small_disk, 100_000, "train.py", *args)
    assert_full_disk_error(done, out / "resume.pt")
    assert {name: (out / name).read_bytes() for name in before} == before and temps(out) == []
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "8", "--resume")) == 0  # room again


# ----------------------------------------------------------------------------- NaN / inf


def nan_losses_at(monkeypatch, updates: set[int]) -> None:
    """Make the loss of these updates (numbered from 1 over the whole run) NaN, and so their gradients."""
    train_step, margin_loss, current = train.Trainer.train_step, train.margin_loss, {}

    def step(self, *args):
        current["update"] = self.step + 1
        return train_step(self, *args)

    def loss(*args, **kwargs):
        value = margin_loss(*args, **kwargs)
        return value * math.nan if current["update"] in updates else value

    monkeypatch.setattr(train.Trainer, "train_step", step)
    monkeypatch.setattr(train, "margin_loss", loss)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(sp_file, pairs_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    nan_losses_at(monkeypatch, {7})
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "20", "--save-every", "4")) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {out / 'resume.pt'}: kept as the last good checkpoint") and "update 7" in line
    assert "the loss is nan" in line and "--on-nan skip" in line
    assert resume.load_resume_state(out)["position"]["step"] == 4
    assert torch.isfinite(weights(out / "model.pt")).all()
    assert temps(out) == []
    args = train_args(
        pairs_file, sp_file, out, "--max-steps", "20", "--save-every", "4", "--resume", "--on-nan", "skip"
    )
    assert train.main(args) == 0
    assert "update 7: the loss is nan; batch skipped" in capsys.readouterr().err
    state = resume.load_resume_state(out)
    assert state["position"]["step"] == 20 and state["skipped"] == 1
    assert torch.isfinite(state["model"]["embedding"]).all()


def test_nan_skip_counts_skipped_batches_and_leaves_the_table_alone(sp_file, pairs_file, tmp_path, monkeypatch):
    nan_losses_at(monkeypatch, {1, 2, 3})  # every update skipped: the table must not move
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "3", "--on-nan", "skip")) == 0
    tokenizer = models.Tokenizer(sp_file.read_bytes(), lowercase=True)
    start = run_setup.new_model(train.parse_args(train_args(pairs_file, sp_file, out)), out, 1, True, sp=tokenizer)
    assert torch.equal(weights(out / "model.pt"), start.embedding.weight.detach())
    last = [line for line in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in line][-1]
    assert '"skipped": 3' in last


def test_a_non_finite_table_is_never_saved(sp_file, pairs_file, tmp_path, monkeypatch, capsys):
    """A table gone non-finite despite finite gradients (here: forced) stops the run at the next save."""
    step = train.LazyAdam.step

    def breaking_step(self, rows, grad):
        step(self, rows, grad)
        if self.steps == 8:  # right before the save at update 8
            self.table[rows[0]] = float("inf")

    monkeypatch.setattr(train.LazyAdam, "step", breaking_step)
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "12", "--save-every", "4")) == 3
    assert "the model's weights are not finite at update 8" in capsys.readouterr().err
    assert resume.load_resume_state(out)["position"]["step"] == 4 and torch.isfinite(weights(out / "model.pt")).all()


def test_nan_stop_is_one_line_with_status_3(sp_file, pairs_file, tmp_path, monkeypatch, capsys):
    nan_losses_at(monkeypatch, {2})
    done = run_main(train, capsys, *train_args(pairs_file, sp_file, tmp_path / "r", "--max-steps", "9"))
    assert_one_line_error(done, "nothing saved yet", "update 2", status=3)
    assert not (tmp_path / "r" / "model.pt").exists()


# ----------------------------------------------------------------------------- damaged files


def damaged_copies(data: bytes, folder: Path) -> dict[str, Path]:
    """Empty, truncated (several points), garbage and bit-flipped copies of a file."""
    rng = np.random.default_rng(0)
    flipped = bytearray(data)
    for i in rng.integers(0, len(data), 40):
        flipped[i] ^= 0xFF
    copies = {
        "empty": b"",
        "first byte": data[:1],
        "truncated 10%": data[: len(data) // 10],
        "truncated 50%": data[: len(data) // 2],
        "last byte missing": data[:-1],
        "garbage": rng.integers(0, 256, len(data), dtype=np.uint8).tobytes(),
        "text": b"not a model at all\n",
        "bit flips": bytes(flipped),
    }
    paths = {}
    for name, blob in copies.items():
        paths[name] = folder / f"{name.replace(' ', '_').replace('%', '')}.bin"
        paths[name].write_bytes(blob)
    return paths


def test_damaged_checkpoints_are_one_line_errors_naming_the_file(tiny_model_file, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("hello\n")
    for name, path in damaged_copies(tiny_model_file.read_bytes(), tmp_path).items():
        args = ["--sentence-file", tmp_path / "in.txt", "--load-file", path, "--output-file", tmp_path / "o.npy"]
        status = embed_sentences.main([*map(str, args), "--quiet"])
        err = capsys.readouterr().err
        if name == "bit flips" and status == 0:
            continue  # flips that only hit tensor values leave a loadable model
        assert status == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}: "), (name, err)
        assert not (tmp_path / "o.npy").exists()
    done = run_script("score_sentence_pairs.py", "--sentence-pair-file", tmp_path / "in.txt", "--load-file",
                      tmp_path / "truncated_50.bin")  # fmt: skip
    assert_one_line_error(done, "truncated_50.bin: not a readable model file, truncated or corrupt")


def test_structurally_wrong_checkpoints_are_refused(tiny_model, tmp_path, monkeypatch):
    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    good = torch.load(_saved(tiny_model, tmp_path), weights_only=True)
    cases = {
        "no table": {k: v for k, v in good.items() if k != "embedding"},
        "1-d table": good | {"embedding": torch.zeros(5)},
        "int table": good | {"embedding": good["embedding"].long()},
        "NaN table": good | {"embedding": torch.full_like(good["embedding"], float("nan"))},
        "rows mismatch": good | {"embedding": good["embedding"][:-1]},
        "no config": {k: v for k, v in good.items() if k != "config"},
        "config not a dict": good | {"config": [1, 2]},
        "sp model not bytes": good | {"sp_model": "text"},
        "sp model garbage": good | {"sp_model": b"\x08\x01garbage"},
        "piece rows out of range": good | {"piece_rows": torch.full((len(tiny_model.tokenizer),), 10**6), "unk_row": 0},
        "unk row out of range": good | {"piece_rows": torch.zeros(len(tiny_model.tokenizer), dtype=torch.long), "unk_row": -5},
        "legacy without embedding": {"state_dict": {}, "vocab": {models.LEGACY_UNK: 0}},
        "int8 without row scales": good | {"format_version": checkpoint.INT8_VERSION, "embedding": good["embedding"].to(torch.int8)},
        "int8 scales mismatch": good | {"format_version": checkpoint.INT8_VERSION, "embedding": good["embedding"].to(torch.int8),
                                        "embedding_scale": torch.ones(3, 1)},
    }  # fmt: skip
    sp = tmp_path / "sp.model"
    sp.write_bytes(good["sp_model"])
    for name, state in cases.items():
        path = tmp_path / "case.pt"
        torch.save(state, path)
        with pytest.raises(models.ModelError, match=f"^{re.escape(str(path))}: ") as info:
            models.load_model(path, sp_model=sp)
        assert "\n" not in str(info.value), name
        with pytest.raises(models.ModelError, match=f"^{re.escape(str(path))}: "):  # the torch-free reader, whose
            load_encoder(path)  # thread scales an int8 table as the fields are checked
        assert thread_errors == [], name  # its failure on unsound fields is silent: the one error line says it


def _saved(model: models.SPModel, folder: Path) -> Path:
    model.save(folder / "good.pt")
    return folder / "good.pt"


class Payload:
    """Pickles to a call of os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_payloads_never_run_from_any_entry_point(tiny_model, sp_file, pairs_file, tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save(torch.load(_saved(tiny_model, tmp_path), weights_only=True) | {"x": Payload(marker)}, evil)
    (tmp_path / "in.txt").write_text("hello\n")
    done = run_main(embed_sentences, capsys, "--sentence-file", tmp_path / "in.txt", "--load-file", evil,
                    "--output-file", tmp_path / "o.npy")  # fmt: skip
    assert_one_line_error(done, f"{evil}: refused to load")
    done = run_main(train, capsys, "--train-file", pairs_file, "--output-dir", tmp_path / "r", "--init-from", evil)
    assert_one_line_error(done, f"{evil}: refused to load")
    run = tmp_path / "resumed"
    assert train.main(train_args(pairs_file, sp_file, run, "--max-steps", "2")) == 0
    torch.save(torch.load(run / "resume.pt", weights_only=True) | {"x": Payload(marker)}, run / "resume.pt")
    done = run_main(train, capsys, *train_args(pairs_file, sp_file, run, "--max-steps", "4", "--resume"))
    assert_one_line_error(done, f"{run / 'resume.pt'}: not a readable training state")
    assert not marker.exists(), "a pickled payload must never run"


def test_damaged_sentencepiece_models_name_the_file(sp_bytes, pairs_file, tmp_path, capsys):
    for name, path in damaged_copies(sp_bytes, tmp_path).items():
        if name == "bit flips":
            continue  # may still parse
        with pytest.raises(models.ModelError, match=f"^{re.escape(str(path))}: ") as info:
            models.read_sp_model(path)
        assert "\n" not in str(info.value)
        args = ["--train-file", pairs_file, "--sp-model", path, "--output-dir", tmp_path / "run"]
        assert train.main([*map(str, args), "--max-steps", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}: not a valid sentencepiece model") and err.count("\n") == 1, err
    legacy = tmp_path / "legacy.pt"
    torch.save({"state_dict": {"embedding.weight": torch.zeros(3, 2)}, "vocab": {models.LEGACY_UNK: 0}}, legacy)
    with pytest.raises(models.ModelError, match=f"^{re.escape(str(tmp_path))}/garbage.bin: not a valid sentencepiece"):
        models.load_model(legacy, sp_model=tmp_path / "garbage.bin")


@pytest.mark.parametrize("member", ["data.pkl", "data/0"])
def test_a_model_file_whose_bytes_fail_their_checksum_is_refused_by_both_readers(tiny_model_file, tmp_path, member):
    """One bit flipped in the pickle or in the table: the zip's CRC-32 says so, and both readers refuse the file
    (torch.load reads a stored tensor without checking it: the table would load wrong, silently)."""
    flipped = tmp_path / "flipped.pt"
    flipped.write_bytes(tiny_model_file.read_bytes())
    with zipfile.ZipFile(flipped) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/" + member))
        start = checkpoint.data_offset(archive, info)
    with open(flipped, "r+b") as f:
        f.seek(start + info.file_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    for load in (load_encoder, models.load_model):
        with pytest.raises(
            models.ModelError, match=f"^{re.escape(str(flipped))}: refused: member .*{member} fails its CRC-32"
        ):
            load(flipped)


@pytest.fixture
def shard_file(sp_bytes, pairs_file, tmp_path) -> Path:
    source = tokenize_pairs(pairs_file, sp_model(sp_bytes), skip_bad=False, threads=1)
    path = tmp_path / "good.h5"
    shards.write_shard(path, *source.read(0, len(source)), sp_bytes, lowercase=True)
    return path


def test_damaged_shards_are_one_line_errors_naming_the_file(shard_file, sp_bytes, sp_file, tmp_path, capsys):
    paths = damaged_copies(shard_file.read_bytes(), tmp_path)
    zeros = tmp_path / "zeros.bin"
    zeros.write_bytes(bytes(1 << 16))
    names = ("ids", "offsets", "attributes", "group", "float ids", "string ids", "huge sentence", "external", "virtual")
    for name in names:
        path = paths[name] = tmp_path / f"{name.replace(' ', '-')}.h5"
        path.write_bytes(shard_file.read_bytes())
        with h5py.File(path, "r+") as f:
            if name == "ids":
                f["src_ids"][3] = 10**6  # an id beyond the vocabulary
            elif name == "offsets":
                f["tgt_offsets"][-1] = 5  # no longer spans the ids
            elif name == "attributes":
                del f.attrs["num_pairs"]
            elif name == "group":
                del f["src_ids"]
                f.create_group("src_ids")
            elif name == "virtual":  # a virtual dataset whose source file is missing
                ids = f["src_ids"]
                layout = h5py.VirtualLayout(shape=ids.shape, dtype=ids.dtype)
                layout[:] = h5py.VirtualSource(str(tmp_path / "missing.h5"), "src_ids", shape=ids.shape)
                del f["src_ids"]
                f.create_virtual_dataset("src_ids", layout)
            elif name in ("float ids", "string ids", "external"):
                ids = f["src_ids"][:]
                del f["src_ids"]
                if name == "float ids":
                    f["src_ids"] = ids.astype(np.float32) + 0.5  # would be truncated silently
                elif name == "string ids":
                    f["src_ids"] = ids.astype("S8")
                else:  # data "stored" in another file (here: zeros)
                    f.create_dataset("src_ids", shape=ids.shape, dtype=ids.dtype, external=[(str(zeros), 0, 1 << 16)])
            else:  # one sentence claims 2^33 ids: the offsets after it are shifted, the total is kept
                offsets = f["src_offsets"][:].astype(np.int64)
                del f["src_offsets"]
                offsets[1:-1] += 1 << 33
                f["src_offsets"] = offsets
    for name, path in paths.items():
        args = ["--train-shards", path, "--sp-model", sp_file, "--output-dir", tmp_path / "run", "--dim", "8"]
        status = train.main([*map(str, args), "--max-steps", "2", "--batch-size", "8", "--megabatch-size", "2"])
        err = capsys.readouterr().err
        if name == "bit flips" and status == 0:
            continue
        line = err.strip().splitlines()[-1]
        assert status == 2 and "Traceback" not in err and line.startswith(f"error: {path}: "), (name, err)
        assert not (tmp_path / "run" / "resume.pt").exists()


# ----------------------------------------------------------------------------- messy text

TEXT_CASES = {
    "empty file": (b"", []),
    "empty lines": (b"\n\n\n", ["", "", ""]),
    "1 MB line": (b"x" * 2**20 + b"\nshort\n", ["x" * 2**20, "short"]),
    "NUL bytes": (b"a\x00b\n\x00\n", ["a\x00b", "\x00"]),
    "invalid UTF-8": (b"ok\n\xff\xfe bad\n\xc3\n", ["ok", "\ufffd\ufffd bad", "\ufffd"]),
    "CRLF": (b"one\r\ntwo\r\n\r\n", ["one", "two", ""]),
    "no final newline": (b"one\ntwo", ["one", "two"]),
    "lone CR": (b"a\rb\n", ["a\rb"]),
    "Unicode line breaks": ("a\u2028b\x85c\x0bd\n".encode(), ["a\u2028b\x85c\x0bd"]),
}


@pytest.mark.parametrize("case", TEXT_CASES)
def test_embed_keeps_one_row_per_line(case, tiny_model_file, tmp_path, capsys):
    raw, lines = TEXT_CASES[case]
    (tmp_path / "in.txt").write_bytes(raw)
    args = ["--sentence-file", tmp_path / "in.txt", "--load-file", tiny_model_file, "--output-file", tmp_path / "o.npy"]
    assert embed_sentences.main([*map(str, args), "--quiet"]) == 0
    got = np.load(tmp_path / "o.npy")
    assert got.shape == (len(lines), 16)
    np.testing.assert_array_equal(got, models.load_model(tiny_model_file).embed_raw_text(lines).reshape(-1, 16))
    bad = sum("\ufffd" in line for line in lines)
    assert (f"warning: {bad} lines had invalid UTF-8" in capsys.readouterr().err) == (bad > 0)


@pytest.mark.parametrize("case", TEXT_CASES)
def test_score_keeps_one_row_per_pair_line(case, tiny_model_file, tmp_path):
    raw, lines = TEXT_CASES[case]
    paired = re.sub(rb"(\r?\n)", rb"\tsame\1", raw) + (b"\tsame" if raw and not raw.endswith(b"\n") else b"")
    (tmp_path / "p.txt").write_bytes(paired)
    args = ["--sentence-pair-file", tmp_path / "p.txt", "--load-file", tiny_model_file, "--output-file", tmp_path / "o"]
    assert score_sentence_pairs.main([*map(str, args), "--quiet"]) == 0
    rows = (tmp_path / "o").read_bytes().decode("utf-8").split("\n")
    assert rows.pop() == "" and [row.rsplit("\t", 1)[0] for row in rows] == [f"{line}\tsame" for line in lines]


def test_pair_files_with_empty_lines_and_strict_utf8(tiny_model_file, tmp_path, capsys):
    (tmp_path / "p.txt").write_bytes(b"a\tb\r\n\r\nc\t\xffd\n")
    base = ["--sentence-pair-file", tmp_path / "p.txt", "--load-file", tiny_model_file, "--output-file", tmp_path / "o"]
    done = run_main(score_sentence_pairs, capsys, *base, "--quiet")
    assert_one_line_error(done, "p.txt:2: expected sentence1<TAB>")
    done = run_main(score_sentence_pairs, capsys, *base, "--quiet", "--skip-bad-lines", "--strict")
    assert_one_line_error(done, "p.txt:3: invalid UTF-8")
    done = run_main(score_sentence_pairs, capsys, *base, "--quiet", "--skip-bad-lines")
    assert done.returncode == 0 and "warning: 1 lines had invalid UTF-8" in done.stderr
    rows = [r.split("\t") for r in (tmp_path / "o").read_text().splitlines()]
    assert [r[:2] for r in rows] == [["a", "b"], ["", ""], ["c", "\ufffdd"]] and rows[1][2] == "nan"


# ----------------------------------------------------------------------------- properties

texts = st.lists(st.text(max_size=40), max_size=30)


def test_embeddings_do_not_depend_on_batch_size_order_or_device(tiny_model, monkeypatch):
    """Device: only the CPU here; "auto" resolves to CUDA where present, so this compares the two there."""
    monkeypatch.setattr(static, "MIN_BATCH", 1)  # batches as small as asked
    other = models.SPModel(tiny_model.tokenizer, tiny_model.embedding.weight.detach().clone())
    other = other.to(models.resolve_device("auto"))

    @PROPERTY
    @given(texts, st.integers(1, 40), st.randoms(use_true_random=False))
    def check(batch, batch_size, rnd):
        full = tiny_model.embed_raw_text(batch)
        np.testing.assert_array_equal(tiny_model.embed_raw_text(batch, batch_size=batch_size), full)
        order = list(range(len(batch)))
        rnd.shuffle(order)
        np.testing.assert_array_equal(tiny_model.embed_raw_text([batch[i] for i in order]).reshape(-1, 16), full[order])
        np.testing.assert_allclose(other.embed_raw_text(batch), full, rtol=1e-5, atol=1e-6)

    check()


def test_scores_are_symmetric_and_in_range(tiny_model):
    @PROPERTY
    @given(st.lists(st.tuples(st.text(max_size=30), st.text(max_size=30)), max_size=20))
    def check(pairs):
        scores = np.array(tiny_model.score_raw_text(pairs))
        np.testing.assert_array_equal(scores, tiny_model.score_raw_text([(b, a) for a, b in pairs]))
        blank = np.array([not (a.strip() and b.strip()) for a, b in pairs], dtype=bool)
        assert np.isnan(scores[blank]).all() and all(-1.0 <= s <= 1.0 for s in scores[~blank])

    check()


def test_save_load_is_exact(sp_bytes, tmp_path):
    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)

    @PROPERTY
    @given(st.integers(1, 24), st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from(STORED_PRECISIONS))
    def check(dim, seed, lowercase, precision):
        table = torch.randn(len(tokenizer), dim, generator=torch.Generator().manual_seed(seed)) * 10
        model = models.SPModel(models.Tokenizer(sp_bytes, lowercase), table)
        model.save(tmp_path / "m.pt", precision=precision)
        loaded = models.load_model(tmp_path / "m.pt")
        values, scale = models.quantize_rows(table)
        expect = {"float32": table, "float16": table.half().float(), "int8": values.float() * scale}[precision]
        assert torch.equal(loaded.embedding.weight.detach(), expect) and loaded.tokenizer.lowercase == lowercase
        assert loaded.tokenizer.sp_model == tokenizer.sp_model and loaded.dim == dim

    check()


# ----------------------------------------------------------------------------- resume: damaged states, other inputs


def damage_state(state: dict, how: str) -> dict:
    """One kind of damage to a training state (what a bad copy, an edit or another version leaves)."""
    if how == "future version":
        state["format_version"] = 99
    elif how == "no position":
        del state["position"]
    elif how == "position not a dict":
        state["position"] = [1, 2]
    elif how == "no step":
        del state["position"]["step"]
    elif how == "args not a dict":
        state["args"] = "x"
    elif how == "table of another shape":
        state["model"]["embedding"] = state["model"]["embedding"][:, :3]
    elif how == "moments of another shape":
        state["optimizer"]["moments"] = torch.zeros(2, 3, 3)
    elif how == "no optimizer steps":
        del state["optimizer"]["steps"]
    elif how == "rng not a tensor":
        state["torch_rng"] = 5
    elif how == "negatives of another length":
        state["negatives"] = torch.zeros(3, dtype=torch.long) if state["negatives"] is not None else torch.zeros(3)
        state["megabatch_pairs"] = 7
    elif how == "pairs count a string":
        state["num_pairs"] = "300"
    return state


@pytest.mark.parametrize(
    "how",
    [
        "future version", "no position", "position not a dict", "no step", "args not a dict", "table of another shape",
        "moments of another shape", "no optimizer steps", "rng not a tensor", "negatives of another length",
        "pairs count a string",
    ],
)  # fmt: skip
def test_a_damaged_training_state_is_one_line_naming_it(how, sp_file, pairs_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "4")) == 0
    state = torch.load(out / "resume.pt", weights_only=True)
    torch.save(damage_state(state, how), out / "resume.pt")
    done = run_main(train, capsys, *train_args(pairs_file, sp_file, out, "--max-steps", "8", "--resume"))
    assert_one_line_error(done, str(out / "resume.pt"))


def test_resume_refuses_other_input_files_unless_forced(sp_file, pairs_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "3")) == 0
    other = tmp_path / "other.tsv"
    other.write_bytes(pairs_file.read_bytes())
    done = run_main(train, capsys, *train_args(other, sp_file, out, "--max-steps", "6", "--resume"))
    line = assert_one_line_error(done, "--train-file", "--force-resume")
    assert str(pairs_file) in line and str(other) in line
    done = run_main(
        train, capsys, *train_args(pairs_file, sp_file, out, "--max-steps", "6", "--resume", "--no-lowercase")
    )
    assert_one_line_error(done, "--lowercase None -> False")
    relative = os.path.relpath(pairs_file)  # the same file named another way is the same input
    assert train.main(train_args(relative, sp_file, out, "--max-steps", "6", "--resume")) == 0
    assert train.main(train_args(other, sp_file, out, "--max-steps", "9", "--resume", "--force-resume")) == 0


def test_nan_dev_scores_never_freeze_best_and_metrics_stay_standard_json(sp_file, pairs_file, tmp_path, monkeypatch):
    out, dev = tmp_path / "run", tmp_path / "dev.tsv"
    pairs = zip(generated_sentences(20, seed=5), generated_sentences(20, seed=6), strict=True)
    dev.write_text("".join(f"{i % 5}.0\t{a}\t{b}\n" for i, (a, b) in enumerate(pairs)))
    calls = iter([math.nan, 10.0, 20.0])
    monkeypatch.setattr(evaluate, "score_sts_file", lambda model, path: {"pearson": next(calls)})
    args = train_args(pairs_file, sp_file, out, "--max-steps", "12", "--save-every", "4", "--dev-file", dev)
    assert train.main(args) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]  # strict JSON
    assert [r["mean"] for r in records if r["event"] == "dev"] == [None, 10.0, 20.0]
    assert models.load_model(out / "best.pt").config["training"]["step"] == 12  # NaN did not hold the best


def test_a_torn_metrics_line_is_cut_on_resume(sp_file, pairs_file, tmp_path):
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "5")) == 0
    log = out / "metrics.jsonl"
    log.write_bytes(log.read_bytes() + b'{"event": "tr')  # a kill in the middle of a line
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "10", "--resume")) == 0
    assert all(json.loads(line) for line in log.read_text().splitlines())


# ----------------------------------------------------------------------------- outputs that must not destroy


def test_an_output_symlink_is_followed_and_kept(tmp_path):
    target, link = tmp_path / "real.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    with fileio.atomic_output(link, "w") as f:
        f.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


def test_a_fifo_output_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    with fileio.atomic_output(fifo) as f:
        f.write(b"through\n")
    reader.join(timeout=10)
    assert got == [b"through\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file beside it


def test_an_output_that_is_an_input_is_refused(tiny_model_file, tmp_path, capsys):
    sentences = tmp_path / "s.txt"
    sentences.write_text("a sentence\nanother one\n")
    link = tmp_path / "same.txt"
    link.symlink_to(sentences)
    done = run_main(embed_sentences, capsys, "--load-file", tiny_model_file, "--sentence-file", sentences,
                    "--output-file", link)  # fmt: skip
    assert_one_line_error(done, "is also an input")
    assert sentences.read_text() == "a sentence\nanother one\n"
    pairs = tmp_path / "p.tsv"
    pairs.write_text("a\tb\n")
    done = run_main(score_sentence_pairs, capsys, "--load-file", tiny_model_file, "--sentence-pair-file", pairs,
                    "--output-file", pairs)  # fmt: skip
    assert_one_line_error(done, "is also an input")
    model_bytes = tiny_model_file.read_bytes()
    done = run_main(evaluate, capsys, "--load-file", tiny_model_file, "--data-dir", tmp_path, "--json", tiny_model_file)
    assert_one_line_error(done, "is also an input")
    assert tiny_model_file.read_bytes() == model_bytes


def test_concat_refuses_to_write_over_one_of_its_parts(tmp_path, capsys):
    parts = [tmp_path / f"p{k}.npy" for k in range(2)]
    for k, part in enumerate(parts):
        np.save(part, np.full((2, 3), k, dtype=np.float32))
    done = run_main(embed_sentences, capsys, "--concat", parts[0], parts[0], parts[1])
    assert_one_line_error(done, "is also an input")
    assert np.load(parts[0]).tolist() == [[0.0] * 3] * 2


# ----------------------------------------------------------------------------- inputs that are not regular files


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_pipes_and_devices_as_inputs_are_refused_before_reading(kind, tiny_model_file, sp_file, tmp_path, capsys):
    """A FIFO would be read twice (counting, then reading) and /dev/zero never ends: both are refused."""
    source = Path("/dev/zero")
    if kind == "fifo":
        source = tmp_path / "fifo"
        os.mkfifo(source)
    runs = [
        (embed_sentences, "--load-file", tiny_model_file, "--sentence-file", source, "--output-file", tmp_path / "o"),
        (score_sentence_pairs, "--load-file", tiny_model_file, "--sentence-pair-file", source),
        (train, "--train-file", source, "--output-dir", tmp_path / "run", "--max-steps", "1"),
        (embed_sentences, "--load-file", source, "--sentence-file", sp_file, "--output-file", tmp_path / "o"),
    ]
    for module, *args in runs:
        assert_one_line_error(run_main(module, capsys, *args), str(source), "not a regular file")
    with pytest.raises(models.ModelError, match="not a regular file"):
        models.read_sp_model(source)


def test_a_line_over_the_limit_is_refused_naming_it(tiny_model_file, pairs_file, tmp_path, capsys, monkeypatch):
    text = tmp_path / "long.txt"
    text.write_bytes(b"short\n" + b"x" * 5000 + b"\nshort\n")
    monkeypatch.setenv(fileio.LINE_LIMIT_ENV, "4096")
    out = tmp_path / "o.npy"
    done = run_main(
        embed_sentences, capsys, "--load-file", tiny_model_file, "--sentence-file", text, "--output-file", out
    )
    assert_one_line_error(done, f"{text}:2: a line of more than 4,096 bytes", fileio.LINE_LIMIT_ENV)
    pairs = tmp_path / "long.tsv"
    pairs.write_bytes(pairs_file.read_bytes() + b"a\t" + b"y" * 5000 + b"\n")
    done = run_main(train, capsys, "--train-file", pairs, "--output-dir", tmp_path / "run", "--max-steps", "1")
    assert_one_line_error(done, f"{pairs}:301: a line of more than 4,096 bytes")
    monkeypatch.setenv(fileio.LINE_LIMIT_ENV, "10000")  # raised: the same file is read
    assert (
        embed_sentences.main(
            ["--load-file", str(tiny_model_file), "--sentence-file", str(text), "--output-file", str(out)]
        )
        == 0
    )
    assert np.load(out).shape[0] == 3
    for bad in ("abc", "-1", "0", "1.5"):  # not a limit: said, not a traceback, never taken as none
        monkeypatch.setenv(fileio.LINE_LIMIT_ENV, bad)
        done = run_main(
            embed_sentences, capsys, "--load-file", tiny_model_file, "--sentence-file", text, "--output-file", out
        )
        assert_one_line_error(done, f"{fileio.LINE_LIMIT_ENV}={bad}: give the longest line to read in bytes")


# ----------------------------------------------------------------------------- runs that interfere


def test_a_second_training_in_a_busy_folder_is_refused(sp_file, pairs_file, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with fileio.lock_folder(out):  # as another running training holds it
        done = run_main(train, capsys, *train_args(pairs_file, sp_file, out, "--max-steps", "2"))
        assert_one_line_error(done, str(out), "another process is training")
    assert train.main(train_args(pairs_file, sp_file, out, "--max-steps", "2")) == 0  # free again


def test_stale_temp_cleanup_keeps_a_running_jobs_temps(tmp_path):
    out = tmp_path / "model.pt"
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine, other, gone = (tmp_path / f".model.pt.{pid}.abcd1234.tmp" for pid in (os.getpid(), alive.pid, 2**22 + 7))
        for path in (mine, other, gone):
            path.write_text("x")
        assert fileio.remove_stale_temps(out) == 1
        assert mine.exists() and other.exists() and not gone.exists()
    finally:
        alive.kill()
        alive.wait()
    assert fileio.remove_stale_temps(out) == 1 and mine.exists()  # the other job is gone now


def test_scratch_folders_of_killed_runs_are_removed_and_the_new_one_too(tmp_path):
    dead = tmp_path / f".shuffle.{2**22 + 7}.abc"
    dead.mkdir()
    (dead / "bucket").write_text("left by a kill")
    live = tmp_path / f".shuffle.{os.getpid()}.xyz"  # another job of this process, still working
    live.mkdir()
    with fileio.scratch_folder(tmp_path, ".shuffle") as tmp:
        (tmp / "bucket").write_text("x")
        assert not dead.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]


# ----------------------------------------------------------------------------- unbounded memory and time


def test_a_billion_laughs_config_is_refused_at_once(tiny_model, tmp_path, capsys, pairs_file):
    laughs = ["lol"]
    for _ in range(60):
        laughs = [laughs, laughs]  # 2^60 leaves when walked, a few KB in the file (pickle shares them)
    state = tiny_model.checkpoint()
    state["config"]["notes"] = laughs
    path = tmp_path / "laughs.pt"
    torch.save(state, path)
    start = time.perf_counter()
    with pytest.raises(models.ModelError, match="nested or repeated beyond any real config"):
        models.load_model(path)
    done = run_main(train, capsys, "--train-file", pairs_file, "--output-dir", tmp_path / "r", "--init-from", path)
    assert_one_line_error(done, str(path), "nested or repeated")
    assert time.perf_counter() - start < 30


def test_a_zip_bomb_model_is_refused_before_inflating(tmp_path):
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("archive/data.pkl", "w", force_zip64=True) as member:
            for _ in range(80):
                member.write(bytes(1 << 20))  # 80 MiB of zeros in about 80 KB
    assert path.stat().st_size < 1 << 20
    with pytest.raises(models.ModelError, match="inflates .* to 83,886,080"):
        models.load_model(path)


def test_a_full_disk_in_a_scratch_folder_names_it(small_disk, tmp_path):
    """The shuffle's buckets fill the disk: the error names the scratch folder, which is removed."""
    folder = where(small_disk, tmp_path)
    folder.mkdir(exist_ok=True)
    src = tmp_path / "pairs.tsv"  # outside the small disk
    src.write_text("".join(f"sentence {i} with some words\tanother one {i}\n" for i in range(60_000)))
    done = run_with_little_room(small_disk, 200_000, "preprocess/steps.py", "shuffle", src, "--out", folder / "s.tsv")
    line = assert_one_line_error(done, f"{folder}/.shuffle.")
    assert any(reason in line for reason in FULL), line
    assert sorted(p.name for p in folder.iterdir() if p.name != "filler") == []


def test_a_large_output_goes_to_disk_while_it_is_written_not_all_at_its_fsync(tmp_path, monkeypatch):
    """fileio.flushing: pages of the file written in the block are synced every so often by a thread, which is gone
    when the block ends (embed's .npy output, written by its workers through a memory map, is written in one)."""
    synced, real = [], os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(os.fstat(fd).st_size) or real(fd))
    path = tmp_path / "rows.bin"
    path.write_bytes(b"")
    with fileio.flushing(path, every=0.02):
        with open(path, "ab") as f:
            for _ in range(20):
                f.write(b"x" * 4096)
                f.flush()
                time.sleep(0.01)
        time.sleep(0.1)
    assert synced and max(synced) == 20 * 4096  # synced while the block ran, up to what it wrote
    assert not [t for t in threading.enumerate() if t.name == "flushing"]


def hostile_layouts(tiny_model, tmp_path) -> dict[str, Path]:
    """Model files whose tables declare far more than they hold: views of 80,000 rows (stride 0, overlapping
    strides; float and int8), and a file whose members, each under the per-member floor, inflate past it together."""
    pieces = len(tiny_model.tokenizers[0])
    views = {
        "stride-0 80,000 x 12,000": torch.zeros(1).expand(80_000, 12_000),
        "stride-0 80,000 x 65,536": torch.zeros(1).expand(80_000, 65_536),
        "overlapping strides": torch.zeros(100_000).as_strided((80_000, 12_000), (1, 1)),
        "int8 stride-0": torch.zeros(1, dtype=torch.int8).expand(80_000, 65_536),
    }
    files = {}
    for name, table in views.items():
        state = tiny_model.checkpoint() | {"embedding": table, "piece_rows": torch.arange(pieces), "unk_row": 0}
        if table.dtype == torch.int8:
            state |= {"format_version": 2, "embedding_scale": torch.ones(1, dtype=torch.bfloat16).expand(80_000, 1)}
        files[name] = tmp_path / f"{name.replace(' ', '_').replace(',', '')}.pt"
        torch.save(state, files[name])
    files["members inflating together"] = path = tmp_path / "deflated.pt"
    tiny_model.save(path)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
        for k in range(2):
            with z.open(f"tiny/data/extra{k}", "w", force_zip64=True) as member:
                for _ in range(60):
                    member.write(bytes(1 << 20))  # 60 MiB of zeros, each under the 64 MiB floor of one member
    return files


@pytest.mark.long
def test_hostile_model_layouts_are_refused_in_one_line_in_little_memory_and_time(tiny_model, tmp_path):
    """Both readers (load_model, load_encoder: the commands' torch-free one) and paraphrastic-embed refuse each file
    in one line, within 10 s and under 1 GB at the peak (a stride-0 table once took 6.8 GB; 200 deflated members
    7.4 GB). One process a reader reads every file, its peak reset before each (/proc/self/clear_refs)."""
    code = """
import sys, time
from paraphrastic import load_encoder, models
from paraphrastic.fileio import ModelError
read = models.load_model if sys.argv[1] == "torch" else load_encoder
for path in sys.argv[2:]:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts again from what the process holds now
    start = time.perf_counter()
    try:
        read(path)
        print("loaded")
    except ModelError as e:
        peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print("refused", time.perf_counter() - start, peak >> 10, str(e).replace(chr(10), "|"))
"""
    (tmp_path / "s.txt").write_text("a man plays a guitar\n")
    layouts = hostile_layouts(tiny_model, tmp_path)
    for reader in ("torch", "torch-free"):
        done = subprocess.run([sys.executable, "-c", code, reader, *map(str, layouts.values())], capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        lines = done.stdout.splitlines()
        assert len(lines) == len(layouts), (reader, done.stdout, done.stderr[-1500:])
        for (name, path), line in zip(layouts.items(), lines, strict=True):
            said, seconds, peak_mib, message = (line.split(" ", 3) + ["", "", "", ""])[:4]
            assert said == "refused" and float(seconds) < 10 and int(peak_mib) < 1024, (name, reader, line)
            assert "|" not in message.strip() and str(path) in message, (name, message)
    for name, path in layouts.items():
        embed = [sys.executable, "-m", "paraphrastic.embed_sentences", "--load-file", str(path), "--sentence-file",
                 str(tmp_path / "s.txt"), "--output-file", str(tmp_path / "v.npy")]  # fmt: skip
        done = subprocess.run(["prlimit", f"--as={3 << 30}", *embed], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "error:" in done.stderr, (name, done.stderr)
