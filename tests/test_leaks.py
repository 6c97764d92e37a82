"""Nothing left behind: shared-memory files and training temporaries carry their process id and are removed by
the next run once their owner is dead; a bad --device is a usage error, never a traceback."""

import subprocess
import sys

import numpy as np
import pytest

from paraphrastic import embed_sentences, evaluate, mine_bitext, score_sentence_pairs, static, train


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_shared_rows_of_a_dead_process_are_removed_by_the_next_call(tmp_path, monkeypatch):
    monkeypatch.setattr(static, "SHM_DIR", tmp_path)
    stale = tmp_path / f"{static.SHARED_ROWS}.{dead_pid()}.abcdefgh.npy"
    stale.write_bytes(b"rows of a killed encode")
    other = tmp_path / f"{static.SHARED_ROWS}.notapid.npy"
    other.write_bytes(b"")
    with static.shared_rows(10, 4) as (path, rows):
        assert path.name.startswith(f"{static.SHARED_ROWS}.{static.os.getpid()}.") and rows.shape == (10, 4)
        assert not stale.exists() and other.exists()
    assert not path.exists()


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
