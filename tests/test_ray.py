"""--engine ray on a local Ray with 2 CPUs: the Parquet parts of 16 files equal paraphrastic-embed on their
concatenation row for row, scoring likewise, mining equals the single-machine miner on Tatoeba and PUD, and a
worker killed mid-job still leaves every line exactly once."""

import gzip
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import generated_sentences

from paraphrastic import embed_sentences, mine_bitext, precision, score_sentence_pairs
from paraphrastic.ray_engine import Parts

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


@pytest.fixture
def engine(local_ray):
    import ray

    from paraphrastic import ray_engine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # DyingParts below, for the workers
    return ray_engine


def awkward_files(folder: Path) -> list[Path]:
    """16 files: plain and gzip, empty lines, invalid UTF-8, some without a final newline, one empty."""
    folder.mkdir()
    sentences = [s.encode() for s in generated_sentences(1600, seed=11)]
    files = []
    for i in range(16):
        body = b"\n".join(sentences[i * 100 : (i + 1) * 100]) + (b"" if i % 5 == 0 else b"\n")
        if i == 3:
            body = b"\n\n" + body + b"\xff\xfe broken\n"
        if i == 7:
            body = b""
        path = folder / (f"f{i:02d}.txt.gz" if i % 2 else f"f{i:02d}.txt")
        path.write_bytes(gzip.compress(body) if i % 2 else body)
        files.append(path)
    return files


def concatenation(files: list[Path], out: Path) -> Path:
    """The files' lines one after the other, as one plain file (a newline added where a file lacks its last)."""
    parts = []
    for path in files:
        body = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        parts.append(body + (b"\n" if body and not body.endswith(b"\n") else b""))
    out.write_bytes(b"".join(parts))
    return out


def test_embedding_16_files_on_ray_equals_one_machine_on_their_concatenation(engine, tiny_model_file, tmp_path):
    files = awkward_files(tmp_path / "in")
    out = tmp_path / "vectors"
    args = ["--engine", "ray", "--input", str(tmp_path / "in" / "*"), "--output-dir", out, "--load-file"]
    assert embed_sentences.main([*map(str, args), str(tiny_model_file)]) == 0
    table = engine.read_parts(out)
    single = tmp_path / "single.npy"
    args = ["--sentence-file", concatenation(files, tmp_path / "all.txt"), "--load-file", tiny_model_file]
    assert embed_sentences.main([*map(str, args), "--output-file", str(single), "--quiet"]) == 0
    vectors = table.column("vector").combine_chunks().flatten().to_numpy().reshape(len(table), -1)
    assert vectors.tobytes() == np.load(single).tobytes()  # the parts in name order are the input order
    counts = [len(concatenation([f], tmp_path / "one.txt").read_bytes().splitlines()) for f in files]
    want = [(str(f), line) for f, n in zip(files, counts, strict=True) for line in range(n)]
    assert list(zip(table.column("file").to_pylist(), table.column("line").to_pylist(), strict=True)) == want
    args = ["--engine", "ray", "--input", str(tmp_path / "in" / "*"), "--load-file", tiny_model_file, "--dtype"]
    assert embed_sentences.main([*map(str, args), "ubinary", "--output-dir", str(tmp_path / "bits")]) == 0
    bits = engine.read_parts(tmp_path / "bits").column("vector").combine_chunks()
    packed = bits.flatten().to_numpy().reshape(len(bits), -1)  # each row's signs, as the local command packs them
    assert packed.dtype == np.uint8 and np.array_equal(packed, precision.signs(np.load(single)))
    shape = ["--normalize", "--truncate-dim", "8", "--dtype", "float16", "--output-dir", str(tmp_path / "cut")]
    assert embed_sentences.main([*map(str, args[:-1]), *shape]) == 0
    cut = engine.read_parts(tmp_path / "cut").column("vector").combine_chunks()
    local = precision.rows_as(np.load(single), normalize=True, precision="float16", dims=8)  # as the workers cut
    assert np.array_equal(cut.flatten().to_numpy().reshape(len(cut), -1), local)


def test_a_parquet_input_is_cut_at_row_groups_into_items_that_give_its_rows_in_order(engine, tiny_model_file,
                                                                                     tmp_path):  # fmt: skip
    """One large Parquet file is many items (runs of whole row groups), not one for a single actor; its rows come
    back in order, a null text embedded as an empty line, as the local command embeds the same lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = generated_sentences(230, seed=16)
    texts[120] = None
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": range(230), "text": texts}), path, row_group_size=50)  # groups of 50, last 30
    items = engine.plan([path], lines_per_item=100)
    assert [(i["first"], i["offset"], i["lines"]) for i in items] == [(0, 0, 100), (100, 2, 100), (200, 4, 30)]
    out = tmp_path / "vectors"
    out.mkdir()
    done = engine.run(items, out, 2, model=str(tiny_model_file), text_column="text")
    assert [sum(done[i["item"]]["part_rows"]) for i in items] == [100, 100, 30]
    table = pq.read_table(sorted(out.glob("part-*.parquet.staged")))
    assert table.column("line").to_pylist() == list(range(230))
    lines = tmp_path / "lines.txt"
    lines.write_text("".join((t or "") + "\n" for t in texts), encoding="utf-8")
    single = tmp_path / "single.npy"
    args = ["--sentence-file", lines, "--load-file", tiny_model_file, "--output-file", single, "--quiet"]
    assert embed_sentences.main([*map(str, args)]) == 0
    vectors = table.column("vector").combine_chunks().flatten().to_numpy().reshape(len(table), -1)
    assert vectors.tobytes() == np.load(single).tobytes()


class PidParts(Parts):
    """Parts that note which process ran each item, then wait until both items have begun (at most 5 s: with one
    actor taking both, the second never begins while the first runs)."""

    def work(self, item):
        with open(self.out / "pids", "a") as f:
            f.write(f"{item['item']} {os.getpid()}\n")
        began = time.monotonic()
        while len((self.out / "pids").read_text().splitlines()) < 2 and time.monotonic() - began < 5:
            time.sleep(0.02)
        return super().work(item)


def test_as_many_items_as_actors_go_one_to_each(engine, tiny_model_file, tmp_path):
    """The first actor ready used to take two items (one running, one queued), so that two items on two actors
    (a Parquet file of two row groups) ran one after the other on one of them."""
    path = tmp_path / "in.txt"
    path.write_text("".join(s + "\n" for s in generated_sentences(200, seed=17)))
    out = tmp_path / "vectors"
    out.mkdir()
    engine.run(engine.plan([path], lines_per_item=100), out, 2, actor=PidParts, model=str(tiny_model_file))
    ran = dict(line.split() for line in (out / "pids").read_text().splitlines())
    assert sorted(ran) == ["0", "1"] and len(set(ran.values())) == 2


def test_gz_files_fewer_than_the_cpus_get_a_note_naming_the_largest(tmp_path):
    from paraphrastic import ray_engine

    (tmp_path / "small.txt.gz").write_bytes(gzip.compress(b"a man\n"))
    (tmp_path / "large.txt.gz").write_bytes(gzip.compress(os.urandom(1000)))
    (tmp_path / "plain.txt").write_text("a man\n" * 5)
    items = ray_engine.plan([tmp_path / "small.txt.gz", tmp_path / "large.txt.gz", tmp_path / "plain.txt"], 2)
    note = ray_engine.idle_note(items, 8)  # 5 items: the plain file's 3 and one for each .gz file
    assert (
        note.startswith("note: fewer work items than CPUs (5 for 8)")
        and "such as " + str(tmp_path / "large.txt.gz") in note
    )
    assert ray_engine.idle_note(items, 5) is None  # no CPU idle
    assert ray_engine.idle_note(items[2:3], 8) is None  # idle for want of lines, not because of a .gz file


def test_scoring_on_ray_equals_one_machine(engine, tiny_model_file, tmp_path):
    (tmp_path / "in").mkdir()
    sentences = generated_sentences(400, seed=12)
    files = []
    for i in range(4):
        lines = [f"{a}\t{b}" for a, b in zip(sentences[i * 100 : i * 100 + 99], sentences[i * 100 + 1 :], strict=False)]
        body = ("\n".join(lines) + "\nno tab here\n").encode()
        path = tmp_path / "in" / (f"p{i}.tsv.gz" if i % 2 else f"p{i}.tsv")
        path.write_bytes(gzip.compress(body) if i % 2 else body)
        files.append(path)
    out = tmp_path / "scores"
    args = ["--engine", "ray", "--input", *map(str, files), "--output-dir", str(out), "--skip-bad-lines"]
    assert score_sentence_pairs.main([*args, "--load-file", str(tiny_model_file)]) == 0
    scores = engine.read_parts(out).column("score").to_numpy()
    single = tmp_path / "single.tsv"
    args = ["--sentence-pair-file", str(concatenation(files, tmp_path / "all.tsv")), "--skip-bad-lines", "--quiet"]
    assert score_sentence_pairs.main([*args, "--load-file", str(tiny_model_file), "--output-file", str(single)]) == 0
    want = np.array([float(line.rsplit("\t", 1)[1]) for line in single.read_text().splitlines()])
    assert len(scores) == len(want) == 400 and np.array_equal(np.round(scores, 6), want, equal_nan=True)


def test_mining_on_ray_equals_the_single_machine_miner(engine, shared_data, tmp_path):
    """PUD's German-English set with the multilingual model: the same pairs and scores, to the digit printed
    (faiss's exact search on one thread, as each Ray task searches)."""
    source, target = shared_data / "pud" / "deu-eng.deu", shared_data / "pud" / "deu-eng.eng"
    outs = []
    for engine in ("local", "ray"):
        out = tmp_path / f"{engine}.tsv"
        args = ["--source", source, "--target", target, "--load-file", "multilingual", "--output-file", out]
        args += ["--threshold=-inf", "--quiet", "--threads", "1", "--engine", engine]
        assert mine_bitext.main(list(map(str, args))) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) > 900


def test_paraphrase_mining_on_ray_equals_the_single_machine_miner(engine, tiny_model_file, tmp_path):
    path = tmp_path / "en.txt"
    path.write_text("\n".join(generated_sentences(300, seed=13) * 2) + "\n\n")  # duplicates, a blank line
    outs = []
    for engine, cut in (
        ("local", []),
        ("ray", []),
        ("local", ["--truncate-dim", "8"]),
        ("ray", ["--truncate-dim", "8"]),
    ):
        out = tmp_path / f"{engine}.tsv"
        args = ["--paraphrase", path, "--load-file", tiny_model_file, "--output-file", out, "--threshold=-inf", *cut]
        assert mine_bitext.main([*map(str, args), "--quiet", "--threads", "1", "--engine", engine]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1] and outs[0]
    assert outs[2] == outs[3] and outs[2] != outs[0]  # the first 8 values searched, on Ray as on one machine


class DyingParts(Parts):
    """Parts whose process kills itself the first time it reaches work item 5 (a marker file remembers)."""

    def work(self, item):
        marker = self.out / "killed-once"
        if int(item["item"]) == 5 and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().work(item)


def test_a_worker_killed_mid_job_still_gives_every_line_once(engine, tiny_model_file, tmp_path):
    import pyarrow.parquet as pq

    files = awkward_files(tmp_path / "in")
    out = tmp_path / "vectors"
    out.mkdir()
    items = engine.plan(files, lines_per_item=40)  # several items a file
    engine.run(items, out, 2, actor=DyingParts, model=str(tiny_model_file))
    assert (out / "killed-once").exists()  # the worker did die, and its item was run again
    table = pq.read_table(sorted(out.glob("part-*.parquet.staged")))  # the parts run() wrote (no manifest: no job)
    keys = list(zip(table.column("file").to_pylist(), table.column("line").to_pylist(), strict=True))
    assert (
        len(keys)
        == len(set(keys))
        == sum(len(concatenation([f], tmp_path / "one.txt").read_bytes().splitlines()) for f in files)
    )
    single = tmp_path / "single.npy"
    args = ["--sentence-file", concatenation(files, tmp_path / "all.txt"), "--load-file", tiny_model_file]
    assert embed_sentences.main([*map(str, args), "--output-file", str(single), "--quiet"]) == 0
    vectors = table.column("vector").combine_chunks().flatten().to_numpy().reshape(len(table), -1)
    assert vectors.tobytes() == np.load(single).tobytes()


class HangingParts(Parts):
    """Parts whose actor hangs the first time it reaches work item 5 (a marker file remembers)."""

    def work(self, item):
        marker = self.out / "hung-once"
        if int(item["item"]) == 5 and not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(3600)
        return super().work(item)


def test_a_hung_worker_is_replaced_and_its_item_run_again(engine, tiny_model_file, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(engine, "STALL_S", 2.0)
    files = awkward_files(tmp_path / "in")
    out = tmp_path / "vectors"
    out.mkdir()
    began = time.monotonic()
    items = engine.plan(files, lines_per_item=40)
    done = engine.run(items, out, 2, actor=HangingParts, model=str(tiny_model_file))
    assert (out / "hung-once").exists() and time.monotonic() - began < 60
    table = pq.read_table(sorted(out.glob("part-*.parquet.staged")))
    keys = list(zip(table.column("file").to_pylist(), table.column("line").to_pylist(), strict=True))
    lines = sum(len(concatenation([f], tmp_path / "one.txt").read_bytes().splitlines()) for f in files)
    assert len(keys) == len(set(keys)) == sum(sum(r["part_rows"]) for r in done.values()) == lines


class SlowWholeParts(Parts):
    """Parts of 10 lines, where each part of a .gz file takes 0.3 s: a whole-file item that runs for
    many times the other items' time, writing its parts as it goes (each start noted in a file)."""

    def __init__(self, *args, **kwargs):
        from paraphrastic import ray_engine

        ray_engine.PART_LINES = 10  # in this actor's process
        super().__init__(*args, **kwargs)

    def work(self, item):
        if item["file"].endswith(".gz"):
            with open(self.out / "slow-started", "a") as f:
                f.write(f"{item['item']}\n")
        return super().work(item)

    def vectors(self, file, first, lines):
        if file.endswith(".gz"):
            time.sleep(0.3)
        return super().vectors(file, first, lines)


def test_a_long_whole_file_item_that_writes_its_parts_is_not_taken_for_lost(engine, tiny_model_file, tmp_path,
                                                                           monkeypatch):  # fmt: skip
    """A .gz file is one item whatever its length: among short items it runs for many times their median, and
    must not be killed as stalled while it writes parts (it was, again and again, until the run gave up). It is
    also run first, so that the run does not end on it."""
    import pyarrow.parquet as pq

    monkeypatch.setattr(engine, "STALL_S", 3.0)  # the stall limit: max(3 s, 10 x the short items' median)
    folder = tmp_path / "in"
    folder.mkdir()
    sentences = generated_sentences(950, seed=15)
    files = [folder / f"f{i}.txt" for i in range(8)]
    for i, path in enumerate(files):
        path.write_text("".join(s + "\n" for s in sentences[i * 100 : (i + 1) * 100]))
    files.append(folder / "long.txt.gz")
    files[-1].write_bytes(gzip.compress("".join(s + "\n" for s in sentences[800:]).encode()))
    out = tmp_path / "vectors"
    out.mkdir()
    items = engine.plan(files, lines_per_item=20)  # 40 short items, then the .gz file's one: 15 parts, 4.5 s+
    done = engine.run(items, out, 2, actor=SlowWholeParts, model=str(tiny_model_file))
    assert (out / "slow-started").read_text() == f"{items[-1]['item']}\n"  # started once, and never killed
    assert sorted(done) == [item["item"] for item in items]
    table = pq.read_table(sorted(out.glob("part-*.parquet.staged")))
    keys = list(zip(table.column("file").to_pylist(), table.column("line").to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == 950
    began = (out / "slow-started").stat().st_mtime_ns
    short = [p for p in out.glob("part-*.parquet.staged") if not p.name.startswith(f"part-{items[-1]['item']:06d}-")]
    assert sum(p.stat().st_mtime_ns < began for p in short) < 10  # of 80: the whole file went first, not last


def test_the_ray_data_stage_adds_a_vector_column(engine, tiny_model_file):
    import ray as ray_module

    texts = generated_sentences(500, seed=14)
    ds = engine.embed_dataset(ray_module.data.from_items([{"text": t} for t in texts]), str(tiny_model_file))
    rows = ds.take_all()
    from paraphrastic import models

    want = models.load_model(tiny_model_file).embed_here(texts)
    got = {row["text"]: row["vector"] for row in rows}
    assert len(rows) == 500 and all(np.array_equal(got[t], w) for t, w in zip(texts, want, strict=True))
    ds = ray_module.data.from_items([{"text": t} for t in texts])
    cut = engine.embed_dataset(ds, str(tiny_model_file), normalize_embeddings=True, truncate_dim=8, precision="ubinary")
    got = {row["text"]: row["vector"] for row in cut.take_all()}
    want = precision.signs(want[:, :8])  # normalizing keeps the signs
    assert all(np.array_equal(got[t], w) for t, w in zip(texts, want, strict=True)) and want.shape == (500, 1)
    with pytest.raises(ValueError, match="precision 'int8': the stage embeds batch by batch"):
        engine.embed_dataset(ds, str(tiny_model_file), precision="int8")


def test_without_ray_the_engine_says_which_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    (tmp_path / "a.txt").write_text("a man\n")
    args = ["--engine", "ray", "--input", str(tmp_path / "a.txt"), "--output-dir", str(tmp_path / "o")]
    assert embed_sentences.main(args) == 2
    assert 'pip install "paraphrastic[ray]"' in capsys.readouterr().err


def test_bad_input_on_ray_is_one_clear_error(engine, tiny_model_file, tmp_path, capsys):
    (tmp_path / "p.tsv").write_text("a man\ta woman\nno tab here\n")
    args = ["--engine", "ray", "--input", str(tmp_path / "p.tsv"), "--output-dir", str(tmp_path / "o")]
    assert score_sentence_pairs.main([*args, "--load-file", str(tiny_model_file)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'p.tsv'}:2: expected")
    assert not (tmp_path / "o").exists()  # nothing left behind
    args[-1] = str(tmp_path / "o2")
    assert score_sentence_pairs.main([*args, "--load-file", str(tmp_path / "nope.pt")]) == 2
    assert "no such model file" in capsys.readouterr().err
