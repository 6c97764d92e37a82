"""Memory bounded by bytes, not lines or lengths: jobs and batches cut by their text's size, a long text tokenized in
pieces, and model files read within a budget (each hostile file of tests/hostile.py: one error line, well under
1 GiB, in both readers)."""

import subprocess
import sys
import time

import numpy as np
import pytest
from hostile import HOSTILE, reader_script

import paraphrastic
from paraphrastic import blocks, fileio, pieces, static, workers


@pytest.fixture(scope="module")
def model():
    return paraphrastic.load_encoder()


def test_line_blocks_are_cut_by_bytes_a_longer_line_alone(tmp_path):
    path = tmp_path / "long.txt"
    lines = [("word " * (20_000 * (1 + i % 3))).strip() for i in range(60)]  # 100 to 300 KB each
    path.write_text("\n".join(lines) + "\n")
    blocks = list(fileio.iter_line_blocks(path, 16384, chunk_bytes=1 << 20))
    assert all(len(blob) <= 1 << 20 or blob.count(b"\n") == 1 for _, blob in blocks) and len(blocks) > 10
    assert b"".join(blob for _, blob in blocks) == path.read_bytes()
    assert [first for first, _ in blocks] == list(np.cumsum([1] + [b.count(b"\n") for _, b in blocks[:-1]]))
    assert all(len(blob) <= fileio.JOB_BYTES for _, blob in fileio.iter_line_blocks(path, 16384))


def test_batches_and_jobs_are_cut_by_characters(model, monkeypatch):
    monkeypatch.setattr(static, "JOB_BYTES", 100_000)
    texts = ["short one"] * 50 + ["x " * 30_000] * 6 + ["short two"] * 50
    sizes = []
    token_ids = model.token_ids
    monkeypatch.setattr(
        model, "token_ids", lambda batch, *a: sizes.append(sum(map(len, batch))) or token_ids(batch, *a)
    )
    vectors = model.embed_here(texts, batch_size=8192)
    assert max(sizes) <= 100_000 and len(sizes) >= 4
    assert np.array_equal(vectors[:50], np.repeat(model.encode(["short one"]), 50, axis=0))
    cuts = static.text_slices(["a" * 5, "b" * 3, "c" * 10, "d", "e"], most=3, chars=8)
    assert cuts == [slice(0, 2), slice(2, 3), slice(3, 5)]


class CountingSP:
    """A sentencepiece processor that records the characters of each encode call."""

    def __init__(self, sp):
        self.sp, self.calls = sp, []

    def encode(self, texts, **kwargs):
        self.calls.append(sum(map(len, texts)))
        return self.sp.encode(texts, **kwargs)


def test_a_long_text_is_tokenized_in_pieces_with_the_same_ids(model, monkeypatch):
    words = " ".join(["the cat sat on the mat while a dog ran after a red ball"] * 8000)  # about 460,000 characters
    whole = model.tokenizer.encode([words])[0]
    counting = CountingSP(model.tokenizer.sp)
    monkeypatch.setattr(model.tokenizer, "sp", counting)
    flat, lengths = model.tokenizer.encode_flat(["a cat", words, "a dog"])
    assert max(counting.calls) <= pieces.SEGMENT_CHARS and len(counting.calls) > 5
    assert lengths[1] == len(whole) and np.array_equal(flat[lengths[0] : lengths[0] + lengths[1]], whole)
    assert pieces.segments("ab cd ef", 4) == ["ab", " cd", " ef"] and pieces.segments("abcdefgh", 3) == [
        "abc",
        "def",
        "gh",
    ]


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory) -> dict:
    """Each hostile model file of tests/hostile.py, built once for both readers (4 s)."""
    folder = tmp_path_factory.mktemp("hostile")
    return {name: build(folder / f"{i}.pt") for i, (name, build) in enumerate(HOSTILE.items())}


@pytest.mark.parametrize("reader", ["static", "torch"])
def test_hostile_model_files_give_one_error_line_within_a_memory_budget(hostile_files, reader):
    files = hostile_files
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", reader_script(reader, files)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    *results, peak = done.stdout.strip().splitlines()
    print(f"{reader} reader: {len(files)} hostile files in {seconds:.1f} s, peak {int(peak.split()[1]) >> 10} MiB")
    for line in results:
        name, result = line.split("\t", 1)
        assert result.startswith(f"error: {files[name]}: "), line
    assert len(results) == len(files) and int(peak.split()[1]) < 1 << 20  # KiB: under 1 GiB, all files in turn


def test_the_workers_plan_reads_the_blocks_iter_line_blocks_reads(tmp_path):
    """line_plan finds, without keeping text, the blocks iter_line_blocks reads: the workers read them by offset."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        sizes = rng.choice([0, 1, 5, 50, 300, 2000, 6000], size=rng.integers(0, 50))
        text = "\n".join("x" * int(n) for n in sizes) + ("\n" if rng.random() < 0.7 else "")
        path = tmp_path / f"{trial}.txt"
        path.write_text(text)
        lines, budget = int(rng.choice([1, 2, 7, 100])), int(rng.choice([1, 100, 4096, 10**6]))
        total = fileio.count_lines(path)
        start = int(rng.integers(0, total + 1))
        stop = None if rng.random() < 0.5 else int(rng.integers(start, total + 1))
        read = [(first, blob) for first, blob in fileio.iter_line_blocks(path, lines, start, stop, chunk_bytes=budget)]
        plan = blocks.line_plan(path, lines, start, stop, chunk_bytes=budget)
        data = path.read_bytes()
        assert [(first, data[at : at + size]) for first, at, size, _ in plan] == read
        assert [n for *_, n in plan] == [blob.count(b"\n") + (not blob.endswith(b"\n")) for _, blob in read]


def test_no_more_workers_are_started_than_a_small_file_has_blocks(tmp_path):
    """workers_for counts the blocks of lines [start, stop) of a file of JOB_BYTES or less as line_plan cuts them
    (a worker without one only costs its start): of 64 threads, one worker per block, at least one."""
    rng = np.random.default_rng(1)
    workers.use_threads(64)
    try:
        for trial in range(60):
            sizes = rng.choice([0, 1, 5, 50, 300], size=rng.integers(0, 400))
            text = "\n".join("x" * int(n) for n in sizes) + ("\n" if rng.random() < 0.7 else "")
            path = tmp_path / f"{trial}.txt"
            path.write_text(text)
            chunk, total = int(rng.choice([1, 7, 100, 16384])), fileio.count_lines(path)
            start = int(rng.integers(0, total + 1))
            stop = None if rng.random() < 0.5 else int(rng.integers(start, total + 1))
            count = len(blocks.line_plan(path, chunk, start, stop))
            assert workers.workers_for(path, chunk, start, stop) == max(1, min(64, count))
        big = tmp_path / "big.txt"
        big.write_bytes(b"a line\n" * (fileio.JOB_BYTES // 7 + 1))  # past one block by bytes: not counted
        assert workers.workers_for(big, 16384) == 64
    finally:
        workers.use_threads(None)


def test_a_plan_for_workers_ends_in_finer_blocks(tmp_path):
    """The last blocks of a plan for N workers, one a worker, are cut TAIL_SPLIT times finer, so that no worker
    runs a whole job alone at the end; the lines and their numbers are those of the one-thread plan."""
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))
    one = blocks.line_plan(path, 400)
    plan = blocks.line_plan(path, 400, threads=4)
    assert [n for *_, n in one] == [400] * 25
    assert [n for *_, n in plan] == [400] * 21 + [100] * 16
    assert [(first, at) for first, at, *_ in plan[21::4]] == [(first, at) for first, at, *_ in one[-4:]]
    assert sum(size for _, _, size, _ in plan) == path.stat().st_size


def test_encode_s_jobs_for_workers_end_in_finer_cuts():
    """encode's forked jobs, cut by count, end as embed's plan does: the last N jobs, one a worker, cut TAIL_SPLIT
    times finer, covering the same texts in order."""
    cuts = static.count_cuts(10_000, 400, workers=4)
    assert [c.stop - c.start for c in cuts] == [400] * 21 + [100] * 16
    assert [c.start for c in cuts] == [0, *(c.stop for c in cuts[:-1])] and cuts[-1].stop == 10_000
    assert static.count_cuts(1_000, 400, workers=4) == [slice(0, 400), slice(400, 800), slice(800, 1_000)]


def test_a_plan_in_parts_covers_the_same_lines_and_names_the_same_long_line(tmp_path, monkeypatch):
    """line_plan's threads each plan a part of the bytes cut at a line start: the blocks differ from one thread's at
    the cuts alone, so they hold the same lines in order, each within the budgets, numbered as one thread numbers
    them; and a line over the limit is named by its number in the file, whichever part holds it."""
    monkeypatch.setattr(blocks, "SPAN_BYTES", 1)  # every file is cut, however small
    monkeypatch.setenv(fileio.LINE_LIMIT_ENV, "5000")
    rng, differ = np.random.default_rng(1), 0
    for trial in range(80):
        sizes = rng.choice([0, 1, 5, 50, 300, 2000, 4999], size=rng.integers(0, 60))
        text = "\n".join("x" * int(n) for n in sizes) + ("\n" if rng.random() < 0.7 else "")
        path = tmp_path / f"{trial}.txt"
        path.write_text(text)
        lines, budget, threads = (
            int(rng.choice([1, 2, 7, 100])),
            int(rng.choice([1, 100, 4096])),
            int(rng.integers(2, 9)),
        )
        total = fileio.count_lines(path)
        start = int(rng.integers(0, total + 1))
        stop = None if rng.random() < 0.5 else int(rng.integers(start, total + 1))
        one = blocks.line_plan(path, lines, start, stop, chunk_bytes=budget)
        plan = blocks.line_plan(path, lines, start, stop, chunk_bytes=budget, threads=threads)
        data = path.read_bytes()
        parts = [data[at : at + size] for _, at, size, _ in plan]
        assert b"".join(parts) == b"".join(data[at : at + size] for _, at, size, _ in one)
        assert sum(n for *_, n in plan) == (total if stop is None else stop) - start
        assert [first for first, *_ in plan] == [start + 1 + sum(n for *_, n in plan[:i]) for i in range(len(plan))]
        assert all(n <= lines and (size <= budget or n == 1) for _, _, size, n in plan)
        with path.open("rb") as f:
            cuts = blocks.line_starts(f, 0, len(data), threads)
        assert cuts[0] == 0 and cuts[-1] == len(data) and len(cuts) <= threads + 1
        assert all(a < b for a, b in zip(cuts, cuts[1:], strict=False)) or not data
        assert all(data[at - 1 : at] == b"\n" for at in cuts[1:-1])  # each a line start
        differ += plan != one
    assert differ > 10  # the parts were cut where a thread's blocks would not have been
    path = tmp_path / "long.txt"
    path.write_text("short\n" * 3000 + "y" * 6000 + "\n" + "short\n" * 3000)
    for threads in (1, 2, 5):
        with pytest.raises(fileio.InputError, match=r"long.txt:3001: a line of more than 5,000 bytes"):
            blocks.line_plan(path, 100, threads=threads)
