"""The parallel path: N worker processes give the one-worker rows bit for bit, in input order, and a worker that
dies stops the run with one clear error and no output."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import generated_sentences

from paraphrastic import embed_sentences, models, score_sentence_pairs, static
from paraphrastic.fileio import Error
from paraphrastic.workers import WorkerError, Workers

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


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_command_leaves_no_worker_and_sigterm_no_temporary(tiny_model_file, tmp_path, how):
    """paraphrastic-embed --threads 2 killed while its workers run: no worker alive 5 s later (they watch their
    parent); SIGTERM is Ctrl-C's clean-up (temporary output removed) and exit 143."""
    path = tmp_path / "big.txt"
    path.write_text("".join(s + "\n" for s in generated_sentences(2000, seed=4)) * 400)
    cmd = [sys.executable, "-m", "paraphrastic.embed_sentences", "--sentence-file", str(path), "--output-file",
           str(tmp_path / "out.npy"), "--load-file", str(tiny_model_file), "--threads", "2", "--quiet"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while len(children(proc.pid)) < 2:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    workers = children(proc.pid)
    time.sleep(0.5)
    proc.send_signal(how)
    code = proc.wait()
    time.sleep(5)
    assert [pid for pid in workers if alive(pid)] == []
    if how == signal.SIGTERM:
        assert code == 143 and "interrupted" in proc.stderr.read()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["big.txt", "tiny.pt"]
