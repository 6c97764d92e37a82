"""Bounded fuzzing (hypothesis) of everything that reads untrusted bytes: the text reader, the pair splitter,
the checkpoint loader and the sentencepiece loader. Each accepts the bytes or refuses them with its own
error type (InputError, ModelError): no other exception, and never code execution."""

import io
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from paraphrastic import fileio, models, shards
from paraphrastic.fileio import InputError, count_lines, iter_line_chunks, split_pair

FUZZ = settings(  # seeded: CI runs the same examples every time
    max_examples=200, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

PIECES = [b"\n", b"\r\n", b"\r", b"\t", b"\x00", b"\xff", b"\xc3", b"\xe2\x82", "é".encode(), "\u2028".encode(), b"a "]
messy_bytes = st.lists(st.sampled_from(PIECES) | st.binary(max_size=6), max_size=60).map(b"".join)


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_text_reader_on_arbitrary_bytes(tmp_path):
    """One line per LF (a CR before it dropped), invalid UTF-8 replaced and counted, or under --strict
    an InputError naming the first bad line; the line count agrees with count_lines. Bytes that open with a known
    format's magic number or hold many NULs are refused as a whole, naming what they are."""
    path = tmp_path / "fuzz.txt"

    @FUZZ
    @given(messy_bytes, st.integers(1, 7), st.booleans())
    @example(b"%PDF", 1, False)  # once drawn by chance: plain text that opens with a PDF's magic number
    @example(b"a\x00" * 9 + b"\n", 2, True)
    def check(data, chunk_lines, strict):
        path.write_bytes(data)
        raw = data.split(b"\n")
        if raw[-1] == b"":
            raw.pop()
        bad = [i + 1 for i, line in enumerate(raw) if not is_utf8(line)]
        kind = fileio.binary_kind(data[:8192])  # a magic number ("%PDF") or many NULs: refused as a whole
        stats: dict = {}
        try:
            got = [line for chunk in iter_line_chunks(path, chunk_lines, strict, stats) for line in chunk]
        except InputError as e:
            if kind:
                assert str(e) == f"{path}: {kind}, not UTF-8 text: give one sentence per line in UTF-8"
            else:
                assert strict and bad and str(e).startswith(f"{path}:{bad[0]}: invalid UTF-8"), str(e)
            return
        assert not kind and not (strict and bad)
        assert got == [line.decode("utf-8", "replace").removesuffix("\r") for line in raw]
        assert stats["invalid_utf8_lines"] == len(bad) and count_lines(path) == len(got)

    check()


@FUZZ
@given(st.text(st.characters() | st.just("\t")))
def test_pair_splitter_on_arbitrary_lines(line):
    tabs = line.count("\t")
    try:
        first, second = split_pair(line, "pairs.tsv", 7)
    except InputError as e:
        assert tabs != 1 and str(e).startswith(f"pairs.tsv:7: expected sentence1<TAB>sentence2, found {tabs} tabs")
    else:
        assert tabs == 1 and f"{first}\t{second}" == line


def mutate(data: bytes, edits: list[tuple[int, bytes]], cut: int | None) -> bytes:
    """Overwrite bytes at the given positions (XOR for single bytes), then truncate at `cut`."""
    out = bytearray(data)
    for pos, blob in edits:
        pos %= max(len(out), 1)
        if len(blob) == 1:
            out[pos] ^= blob[0] or 0xFF
        else:
            out[pos : pos + len(blob)] = blob
    return bytes(out[:cut])


def edits_for(size: int):
    """Edits biased to the ends of the file: the pickle's structure and the zip directory live there."""
    where = st.integers(0, 2047) | st.integers(max(size - 2048, 0), size - 1) | st.integers(0, size - 1)
    return st.lists(st.tuples(where, st.binary(min_size=1, max_size=16)), max_size=6)


class Payload:
    """Pickles to a call of os.system, which must never run, however the file around it is damaged."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["native", "legacy", "payload"])
def test_checkpoint_loader_on_damaged_bytes(kind, sp_bytes, tmp_path):
    """A damaged checkpoint loads into a working model or raises ModelError, nothing else."""
    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    table = torch.randn(len(tokenizer), 4, generator=torch.Generator().manual_seed(0))
    base, sp_file, marker = tmp_path / "base.pt", tmp_path / "sp.model", tmp_path / "pwned"
    sp_file.write_bytes(sp_bytes)
    if kind == "legacy":
        vocab = {tokenizer.sp.id_to_piece(i): i for i in range(len(tokenizer))} | {models.LEGACY_UNK: 0}
        torch.save({"state_dict": {"embedding.weight": table}, "vocab": vocab, "args": {"lower_case": True}}, base)
    else:
        models.SPModel(tokenizer, table).save(base)
        if kind == "payload":
            torch.save(torch.load(base, weights_only=True) | {"x": Payload(marker)}, base)
    data = base.read_bytes()
    path = tmp_path / "damaged.pt"

    @FUZZ
    @given(edits_for(len(data)), st.none() | st.integers(0, len(data)))
    def check(edits, cut):
        path.write_bytes(mutate(data, edits, cut))
        try:
            model = models.load_model(path, sp_model=sp_file)
        except models.ModelError as e:
            assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
            return
        assert kind != "payload", "a checkpoint carrying a payload must never load"
        assert model.embed_raw_text(["a man is riding", ""]).shape == (2, 4)

    check()
    assert not marker.exists(), "a pickled payload must never run"


def test_sentencepiece_loader_on_damaged_bytes(sp_bytes, tmp_path):
    path = tmp_path / "damaged.model"

    @FUZZ
    @given(edits_for(len(sp_bytes)), st.none() | st.integers(0, len(sp_bytes)))
    def check(edits, cut):
        path.write_bytes(mutate(sp_bytes, edits, cut))
        try:
            tokenizer = models.Tokenizer(models.read_sp_model(path), lowercase=True)
        except models.ModelError as e:
            assert str(e).startswith(f"{path}: not a valid sentencepiece model") and "\n" not in str(e)
            return
        ids = tokenizer.encode(["a man is riding a bicycle", ""])
        assert all(0 <= i < len(tokenizer) for i in np.concatenate([np.array(x, dtype=int) for x in ids]))

    check()


def test_shard_reader_on_damaged_bytes(sp_bytes, tmp_path):
    """A damaged training shard reads as pairs within the vocabulary or raises InputError naming it."""
    rng = np.random.default_rng(0)
    sides = [(rng.integers(0, 50, 400).astype(np.int32), np.full(40, 10)) for _ in range(2)]
    good = tmp_path / "good.h5"
    shards.write_shard(good, *sides, sp_bytes, lowercase=True)
    data, path = good.read_bytes(), tmp_path / "damaged.h5"
    pieces = models.Tokenizer(sp_bytes, lowercase=True).sp.get_piece_size()

    @FUZZ
    @given(edits_for(len(data)), st.none() | st.integers(0, len(data)))
    def check(edits, cut):
        """read, and read_many of the same ranges (in reverse order): the same pairs, or InputErrors both."""
        path.write_bytes(mutate(data, edits, cut))
        try:
            shard = shards.Shard(path, sp_model=sp_bytes)
        except InputError as e:
            assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
            return
        starts = np.arange(0, len(shard), 16)[::-1]
        stops = np.minimum(starts + 16, len(shard))
        try:
            each = [shard.read(a, b) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
        except InputError as e:
            assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
            with pytest.raises(InputError, match=f"^{re.escape(str(path))}: damaged training shard"):
                shard.read_many(starts, stops)
            return
        for side, (ids, lengths) in enumerate(shard.read_many(starts, stops)):
            assert len(ids) == lengths.sum() and (len(ids) == 0 or 0 <= ids.min() <= ids.max() < pieces)
            assert np.array_equal(ids, np.concatenate([pair[side][0] for pair in each]))
            assert np.array_equal(lengths, np.concatenate([pair[side][1] for pair in each]))
        shard.close()

    check()


config_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)


def test_checkpoint_config_fuzz(sp_bytes, tmp_path):
    """Any config (types, nesting, keys) gives a working model that saves and reloads, or a ModelError."""
    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    state = models.SPModel(tokenizer, torch.randn(len(tokenizer), 4)).checkpoint()
    path = tmp_path / "model.pt"

    @FUZZ
    @given(st.dictionaries(st.sampled_from(["encoder", "lowercase", "parts", "combine", "dim", "x"]), config_values)
           | config_values)  # fmt: skip
    def check(config):
        torch.save(state | {"config": config}, path)
        try:
            model = models.load_model(path)
        except models.ModelError as e:
            assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
            return
        model.save(tmp_path / "again.pt")
        assert models.load_model(tmp_path / "again.pt").embed_raw_text(["a man"]).shape == (1, model.dim)

    check()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEYS = ["normalizer", "normalizers", "type", "model", "paraphrastic", "sha256", "pre_tokenizer", "vocab"]
json_objects = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), json_values, max_size=5)
json_texts = (
    json_values.map(json.dumps)
    | json_objects.map(json.dumps)
    | st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth)  # nested beyond Python's recursion
    | st.integers(1, 3000).map(lambda depth: '{"normalizer": ' * depth + "1" + "}" * depth)
    | st.binary(max_size=40).map(lambda raw: raw.decode("latin-1"))
)


def test_model_folders_with_any_json_load_or_give_one_clear_error(tiny_model, tmp_path):
    """A sentence-transformers / model2vec folder whose config.json and tokenizer.json take any JSON shape (or are
    not JSON): load_model gives a model or a ModelError naming what is wrong, never another exception."""
    interop = pytest.importorskip("paraphrastic.interop")
    pytest.importorskip("safetensors")
    good = interop.export_folder(tiny_model, tmp_path / "good")
    folder = tmp_path / "fuzzed"

    @FUZZ
    @given(json_texts, json_texts, st.booleans())
    def check(config, tokenizer, keep_sp):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(good, folder)
        (folder / "config.json").write_text(config)
        (folder / "tokenizer.json").write_text(tokenizer)
        if not keep_sp:
            (folder / models.SP_FILE).write_bytes(b"not a sentencepiece model")
        try:
            model = models.load_model(folder)
        except models.ModelError as e:
            assert str(e).startswith(str(folder)) and "\n" not in str(e)
        else:
            assert model.embed_raw_text(["a man"]).shape == (1, tiny_model.dim)

    check()


def test_line_blocks_are_the_lines_in_chunks(tmp_path):
    """The vectorised block reader cuts whole lines (each ending at its LF, the last at the file's end), with their
    numbers, in chunks of `chunk_lines`, for any bytes, chunk size, slice and read size."""
    path = tmp_path / "fuzz.txt"

    @FUZZ
    @given(messy_bytes, st.integers(1, 5), st.integers(0, 6), st.none() | st.integers(0, 12), st.integers(1, 9))
    @example(b"a\nb\nc\n", 2, 0, 1, 9)  # the slice ends inside one read: lines past it are not sent
    def check(data, chunk_lines, start, stop, block):
        path.write_bytes(data)
        lines = io.BytesIO(data).readlines()[start:stop]
        want = [(start + 1 + i, b"".join(lines[i : i + chunk_lines])) for i in range(0, len(lines), chunk_lines)]
        assert list(fileio.iter_line_blocks(path, chunk_lines, start, stop, block)) == want

    check()
