"""Reliability, round 3 (issue 46): what an adversarial user still broke, one test per item it numbers. Each
failure is one `error: FILE[:LINE]: ...` line, nothing is lost, and memory stays bounded."""

import gzip
import io
import json
import os
import shutil
import threading
import tracemalloc
from collections import namedtuple

import numpy as np
import pytest
import torch
from conftest import generated_sentences
from test_hardening import assert_one_line_error, run_main, train_args

from paraphrastic import embed_sentences, fileio, models, score_sentence_pairs, static, train


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(generated_sentences(50, seed=5)) + "\n")
    return path


# ----------------------------------------------------------------------------- 1. outputs that are inputs


def test_1_the_default_model_is_never_an_output(tiny_model_file, text_file, tmp_path, monkeypatch, capsys):
    shipped = tmp_path / "installed" / "default.pt"  # stands in for the installed data/models/default.pt
    shipped.parent.mkdir()
    shutil.copy(tiny_model_file, shipped)
    monkeypatch.setattr(static, "DEFAULT_MODEL", shipped)
    monkeypatch.setitem(static.SHIPPED, "default", shipped)
    before = shipped.read_bytes()
    done = run_main(embed_sentences, capsys, "--sentence-file", text_file, "--output-file", shipped)  # no --load-file
    assert_one_line_error(done, f"{shipped}: is also an input of this run")
    pairs = tmp_path / "p.tsv"
    pairs.write_text("a man\ta woman\n")
    done = run_main(
        score_sentence_pairs, capsys, "--sentence-pair-file", pairs, "--load-file", "default", "--output-file", shipped
    )
    assert_one_line_error(done, f"{shipped}: is also an input of this run")
    assert shipped.read_bytes() == before


def test_1_training_never_replaces_its_own_init_model(pairs_file, sp_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, run, "--max-steps", "2")) == 0
    before = (run / "model.pt").read_bytes()
    args = ["--train-file", pairs_file, "--init-from", run / "model.pt", "--output-dir", run, "--max-steps", "2"]
    done = run_main(train, capsys, *args)
    assert_one_line_error(done, "model.pt: is also an input of this run")
    assert (run / "model.pt").read_bytes() == before


def test_1_an_output_inside_an_input_folder_is_refused(tiny_model, tmp_path, capsys):
    interop = pytest.importorskip("paraphrastic.interop")
    pytest.importorskip("safetensors")
    folder = interop.export_folder(tiny_model, tmp_path / "folder")
    (tmp_path / "in.txt").write_text("a man\n")
    target = folder / "tokenizer.json"
    before = target.read_bytes()
    args = ["--sentence-file", tmp_path / "in.txt", "--load-file", folder, "--output-file", target]
    assert_one_line_error(run_main(embed_sentences, capsys, *args), "is also an input of this run")
    assert target.read_bytes() == before


# ----------------------------------------------------------------------------- 2. modes kept


def test_2_a_replaced_output_keeps_its_mode(tiny_model_file, text_file, tmp_path, capsys):
    out = tmp_path / "out.npy"
    args = ["--sentence-file", text_file, "--load-file", tiny_model_file, "--output-file", out, "--quiet"]
    assert embed_sentences.main(list(map(str, args))) == 0
    out.chmod(0o640)
    assert embed_sentences.main(list(map(str, args))) == 0
    assert out.stat().st_mode & 0o777 == 0o640
    out.chmod(0o444)
    done = run_main(embed_sentences, capsys, *args)
    if os.geteuid() == 0:  # root may write it: replaced, and read-only still
        assert done.returncode == 0 and out.stat().st_mode & 0o777 == 0o444
    else:
        assert_one_line_error(done, f"{out}: is read-only")


# ----------------------------------------------------------------------------- 4. a bad dev file


def test_4_a_bad_dev_file_is_refused_before_any_training(pairs_file, sp_file, tmp_path, capsys):
    dev = tmp_path / "dev.tsv"
    lines = [f"{i % 5}.0\ta man\ta woman" for i in range(1500)] + ["high\ta man\ta woman"]
    dev.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    done = run_main(train, capsys, *train_args(pairs_file, sp_file, run, "--max-steps", "200", "--dev-file", dev))
    assert_one_line_error(done, f"{dev}:1501")
    assert not (run / "resume.pt").exists() and not (run / "metrics.jsonl").exists()


# ----------------------------------------------------------------------------- 5. outputs that cannot fit


def test_5_an_output_larger_than_the_free_space_is_refused_before_writing(
    tiny_model_file, text_file, tmp_path, monkeypatch, capsys
):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(fileio.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    out = tmp_path / "out.npy"
    done = run_main(embed_sentences, capsys, "--sentence-file", text_file, "--load-file", tiny_model_file,
                    "--output-file", out)  # fmt: skip
    assert_one_line_error(done, f"{out}: no space left on device for it", "free some space")
    assert not out.exists() and list(tmp_path.glob(".*.tmp")) == []


# ----------------------------------------------------------------------------- 6-8. model folders


def test_6_7_8_malformed_model_folders_are_one_clear_error(tiny_model, tmp_path):
    interop = pytest.importorskip("paraphrastic.interop")
    pytest.importorskip("safetensors")
    good = interop.export_folder(tiny_model, tmp_path / "good")

    def broken(name: str, **files) -> models.ModelError:
        folder = tmp_path / name
        shutil.copytree(good, folder)
        files = {"config_json": "{}"} | files  # no checksums: a folder another tool wrote
        for file, content in files.items():
            path = folder / file.replace("_json", ".json").replace("_model", ".model")
            if isinstance(content, int):  # a sparse file of that size
                with open(path, "wb") as f:
                    f.truncate(content)
            else:
                path.write_text(content) if isinstance(content, str) else path.write_bytes(content)
        with pytest.raises(models.ModelError) as caught:
            models.load_model(folder)
        assert str(caught.value).startswith(str(folder))
        return caught.value

    assert "nested too deeply" in str(broken("deep", config_json="[" * 100_000 + "]" * 100_000))
    assert "not an object" in str(broken("list", tokenizer_json="[]"))
    assert "normalizer" in str(broken("normalizer", tokenizer_json=json.dumps({"normalizer": [1]})))
    assert "sentencepiece.model" in str(broken("garbage_sp", sentencepiece_model=b"garbage"))
    assert "more than any sentencepiece model" in str(broken("huge_sp", sentencepiece_model=6 << 30))
    huge = broken("huge_table", **{"model.safetensors": 5 << 40})  # more than any machine's memory
    assert "model.safetensors" in str(huge)


# ----------------------------------------------------------------------------- 9. one long line


def test_9_a_long_line_is_refused_without_being_read_whole(tmp_path, monkeypatch):
    path = tmp_path / "one-line.txt"
    path.write_bytes(b"x" * (64 << 20))  # 64 MiB, no newline
    monkeypatch.setenv(fileio.LINE_LIMIT_ENV, str(1 << 20))
    tracemalloc.start()
    with pytest.raises(fileio.InputError, match="one-line.txt:1: a line of more than 1,048,576 bytes"):
        list(fileio.iter_line_blocks(path, 1000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20  # a few reads of 1 MiB, never the 64 MiB line


# ----------------------------------------------------------------------------- 10. training files


def test_10_corrupt_gzip_and_empty_training_files_are_one_clear_error(tmp_path, capsys):
    packed = gzip.compress(b"".join(b"a man %d\ta woman %d\n" % (i, i) for i in range(2000)))
    corrupt = tmp_path / "corrupt.tsv.gz"
    corrupt.write_bytes(packed[:40] + bytes(255 - b for b in packed[40:80]) + packed[80:])
    done = run_main(train, capsys, "--train-file", corrupt, "--output-dir", tmp_path / "a", "--max-steps", "1")
    assert_one_line_error(done, f"{corrupt}: not a readable gzip file")
    empty = tmp_path / "empty.tsv"
    empty.write_text("no tab here\n\t\n")
    done = run_main(train, capsys, "--train-file", empty, "--output-dir", tmp_path / "b", "--skip-bad-lines")
    assert_one_line_error(done, f"{empty}: no training pairs")


# ----------------------------------------------------------------------------- 12. damaged resume.pt


def test_12_a_damaged_position_in_resume_pt_is_one_clear_error(pairs_file, sp_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, run, "--max-steps", "2")) == 0
    state = torch.load(run / "resume.pt", weights_only=True)
    state["position"]["step"] = "5"
    torch.save(state, run / "resume.pt")
    done = run_main(train, capsys, *train_args(pairs_file, sp_file, run, "--max-steps", "4", "--resume"))
    assert_one_line_error(done, "resume.pt: damaged training state", "position")


# ----------------------------------------------------------------------------- 13. shard records


@pytest.mark.parametrize("change", [{"stop": "5"}, {"dtype": "notadtype"}, {"shard": True}, {"lines": -1}], ids=str)
def test_13_damaged_shard_records_are_one_clear_error(tiny_model_file, text_file, tmp_path, capsys, change):
    parts = []
    for i in range(2):
        out = tmp_path / f"part-{i}.npy"
        args = ["--sentence-file", text_file, "--load-file", tiny_model_file, "--output-file", out, "--quiet"]
        assert embed_sentences.main([*map(str, args), "--shard", str(i), "--num-shards", "2"]) == 0
        parts.append(out)
    record = embed_sentences.record_path(parts[1])
    record.write_text(json.dumps(json.loads(record.read_text()) | change))
    done = run_main(embed_sentences, capsys, "--concat", tmp_path / "all.npy", *parts)
    assert_one_line_error(done, "part-1.npy")
    record.write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line_error(run_main(embed_sentences, capsys, "--concat", tmp_path / "all.npy", *parts), "part-1.npy")


# ----------------------------------------------------------------------------- 14. NaN targets


def test_14_nan_distillation_targets_are_refused_naming_the_row(pairs_file, sp_file, tmp_path, capsys):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(generated_sentences(40, seed=9)) + "\n")
    targets = np.random.default_rng(0).normal(size=(40, 16)).astype(np.float32)
    targets[17, 3] = np.nan
    np.save(tmp_path / "targets.npy", targets)
    args = train_args(pairs_file, sp_file, tmp_path / "run", "--max-steps", "2", "--distill", sentences,
                      tmp_path / "targets.npy")  # fmt: skip
    assert_one_line_error(run_main(train, capsys, *args), "targets.npy: row 17 (line 18 of", "NaN")


# ----------------------------------------------------------------------------- 15. skipped lines


def test_15_skipped_lines_are_counted_not_all_kept(tiny_model_file, tmp_path, capsys):
    pairs = tmp_path / "p.tsv"
    pairs.write_text("".join("a man\ta woman\n" if i % 2 else "no tab\n" for i in range(60)))
    done = run_main(score_sentence_pairs, capsys, "--sentence-pair-file", pairs, "--load-file", tiny_model_file,
                    "--skip-bad-lines", "--chunk-lines", "7", "--output-file", tmp_path / "s.tsv")  # fmt: skip
    assert done.returncode == 0
    assert "30 bad lines (not exactly one tab) scored nan: line 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, ... (30 lines)" in (
        done.stderr
    )
    assert len((tmp_path / "s.tsv").read_text().splitlines()) == 60
    args = score_sentence_pairs.parse_args(["--sentence-pair-file", str(pairs), "--skip-bad-lines", "--quiet"])
    written, bad, _, stats = score_sentence_pairs.score_file(models.load_model(tiny_model_file), args, io.StringIO())
    assert written == 60 and len(bad) == score_sentence_pairs.SHOWN and stats["bad_lines"] == 30  # kept: the first


# ----------------------------------------------------------------------------- 17. devices and pipes as outputs


def test_17_embedding_writes_through_to_a_device_or_a_pipe(tiny_model_file, text_file, tmp_path, capsys):
    base = ["--sentence-file", text_file, "--load-file", tiny_model_file, "--quiet"]
    assert run_main(embed_sentences, capsys, *base, "--output-file", "/dev/null").returncode == 0
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.update(rows=np.load(io.BytesIO(fifo.read_bytes()))))
    reader.start()
    assert run_main(embed_sentences, capsys, *base, "--output-file", fifo).returncode == 0
    reader.join(timeout=60)
    assert got["rows"].shape == (50, 16) and fifo.exists() and not fifo.is_file()  # the FIFO stays a FIFO


# ----------------------------------------------------------------------------- 16. compressed sentence files


def test_16_a_gz_sentence_file_is_decompressed(tiny_model_file, text_file, tmp_path):
    packed = tmp_path / "in.txt.gz"
    packed.write_bytes(gzip.compress(text_file.read_bytes()))
    outs = []
    for source in (text_file, packed):
        out = tmp_path / f"{source.name}.npy"
        args = ["--sentence-file", source, "--load-file", tiny_model_file, "--output-file", out, "--quiet"]
        assert embed_sentences.main(list(map(str, args))) == 0
        outs.append(np.load(out))
    assert outs[0].shape == (50, 16) and np.array_equal(outs[0], outs[1])


# ----------------------------------------------------------------------------- 18. errors name the user's file


def test_18_an_output_that_is_a_folder_is_named_before_any_work(tiny_model_file, text_file, tmp_path, capsys):
    folder = tmp_path / "out.npy"
    folder.mkdir()
    done = run_main(embed_sentences, capsys, "--sentence-file", text_file, "--load-file", tiny_model_file,
                    "--output-file", folder)  # fmt: skip
    line = assert_one_line_error(done, f"{folder}: is a folder")
    assert ".tmp" not in line and list(tmp_path.glob(".*.tmp")) == []


# ----------------------------------------------------------------------------- 19. inputs changed in place


def test_19_resume_refuses_a_training_file_changed_in_place(pairs_file, sp_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, run, "--max-steps", "2")) == 0
    lines = pairs_file.read_text().splitlines()
    pairs_file.write_text("\n".join(reversed(lines)) + "\n")  # same path, same size, other content
    done = run_main(train, capsys, *train_args(pairs_file, sp_file, run, "--max-steps", "4", "--resume"))
    assert_one_line_error(done, f"{pairs_file} changed since the run was saved", "--force-resume")
    args = train_args(pairs_file, sp_file, run, "--max-steps", "4", "--resume", "--force-resume")
    assert train.main(args) == 0


def test_18_an_unreadable_input_is_named(tiny_model_file, tmp_path, capsys):
    out = tmp_path / "o.npy"
    done = run_main(embed_sentences, capsys, "--sentence-file", "/proc/self/mem", "--load-file", tiny_model_file,
                    "--output-file", out)  # fmt: skip
    assert_one_line_error(done, "/proc/self/mem: cannot be read")
    corrupt = tmp_path / "in.txt.gz"
    packed = gzip.compress(b"a man\n" * 5000)
    corrupt.write_bytes(packed[:30] + bytes(255 - b for b in packed[30:60]) + packed[60:])
    done = run_main(embed_sentences, capsys, "--sentence-file", corrupt, "--load-file", tiny_model_file,
                    "--output-file", out)  # fmt: skip
    assert_one_line_error(done, f"{corrupt}: not a readable gzip file")
    assert not out.exists()


def test_19_resume_refuses_a_file_changed_only_in_its_middle(sp_file, tmp_path, capsys):
    pairs = tmp_path / "big.tsv"
    lines = [f"a man rides horse number {i}\ta person rides a horse {i}" for i in range(80_000)]  # about 4 MB
    pairs.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    assert train.main(train_args(pairs, sp_file, run, "--max-steps", "2")) == 0
    middle = len(lines) // 2
    lines[middle], lines[middle + 1] = lines[middle + 1], lines[middle]  # same size, same first and last MiB
    pairs.write_text("\n".join(lines) + "\n")
    done = run_main(train, capsys, *train_args(pairs, sp_file, run, "--max-steps", "4", "--resume"))
    assert_one_line_error(done, f"{pairs} changed since the run was saved", "--force-resume")


def test_19_force_resume_says_the_pair_count_must_hold(pairs_file, sp_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert train.main(train_args(pairs_file, sp_file, run, "--max-steps", "2")) == 0
    pairs_file.write_text(pairs_file.read_text() + "one more pair\tand its partner\n")
    args = train_args(pairs_file, sp_file, run, "--max-steps", "4", "--resume", "--force-resume")
    done = run_main(train, capsys, *args)
    assert_one_line_error(
        done, "pairs but the data given has", "--force-resume accepts other files, but only with as many pairs"
    )
