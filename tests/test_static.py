"""The torch-free path (static.py): the same vectors as the torch model, bit for bit, whichever kernel pools, and
commands that only embed a few lines never import torch."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import numpy as np
import pytest
import torch
from conftest import ROOT, generated_sentences
from hypothesis import given, settings
from hypothesis import strategies as st

import paraphrastic
from paraphrastic import checkpoint, models, pieces, static, workers
from paraphrastic.fileio import ModelError

AWKWARD = ["", "   ", "\ufffd", "Ünïcödé and ÇAPS", "x" * 3000, "a\tb"]


def run_without_torch(code: str) -> str:
    """Run `code` in a fresh Python where importing torch fails, so that no path can use it unseen (a finder first
    in sys.meta_path refuses it; `sys.meta_path.pop(0)` lets it in again)."""
    guard = textwrap.dedent("""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "torch":
                    raise ImportError("torch may not be imported here")
        sys.meta_path.insert(0, NoTorch())
    """)
    result = subprocess.run([sys.executable, "-c", guard + textwrap.dedent(code)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("precision", ["float32", "float16", "int8"])
def test_static_model_gives_the_torch_models_bits_with_either_kernel(tiny_model, tmp_path, precision):
    path = tmp_path / "m.pt"
    tiny_model.save(path, precision=precision)
    texts = generated_sentences(3000, seed=5) + AWKWARD
    expected = models.load_model(path).embed_here(texts, batch_size=500)
    encoder = paraphrastic.load_encoder(path)
    assert isinstance(encoder, static.SPEncoder)
    assert encoder.embed_here(texts, batch_size=500).tobytes() == expected.tobytes()  # torch's kernel (loaded)
    np.save(tmp_path / "texts.npy", np.array(texts, dtype=object), allow_pickle=True)
    run_without_torch(f"""
        import numpy as np
        import paraphrastic
        texts = np.load({str(tmp_path / "texts.npy")!r}, allow_pickle=True).tolist()
        np.save({str(tmp_path / "rows.npy")!r}, paraphrastic.load_encoder({str(path)!r}).embed_here(texts, batch_size=500))
    """)
    assert np.load(tmp_path / "rows.npy").tobytes() == expected.tobytes()  # scipy's kernel


def test_static_model_reads_piece_row_maps_as_the_torch_model(sp_bytes, tmp_path):
    tokenizer = models.Tokenizer(sp_bytes, lowercase=False)
    rows = np.arange(len(tokenizer)) % 50 - 1  # some pieces dropped, several sharing a row
    model = models.SPModel(tokenizer, torch.randn(50, 8), piece_rows=rows, unk_row=7)
    model.save(tmp_path / "legacy.pt")
    texts = generated_sentences(200, seed=9) + AWKWARD
    encoder = paraphrastic.load_encoder(tmp_path / "legacy.pt")
    assert isinstance(encoder, static.SPEncoder)
    assert encoder.embed_here(texts).tobytes() == model.embed_here(texts).tobytes()


def test_loading_an_int8_model_builds_its_float_table_at_the_first_large_job_only():
    path = paraphrastic.static.model_path(None)  # the shipped default: int8 rows, bfloat16 scales
    state = checkpoint.read_checkpoint(path)
    rows, dim = state["embedding"].shape
    tracemalloc.start()
    model = checkpoint.static_from_checkpoint(state, path)
    loaded = tracemalloc.get_traced_memory()[1]
    texts = generated_sentences(40)
    small = model.embed_here(texts)  # reads its own rows
    assert model._table is None and loaded < 0.1 * rows * dim * 4
    tracemalloc.reset_peak()
    assert model.table.dtype == np.float32 and model.table.shape == (rows, dim)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1.5 * rows * dim * 4  # scaled in place: a second table-sized array would be 80 MB more
    assert model.embed_here(texts).tobytes() == small.tobytes()  # the whole table's rows: the same bits


def test_a_small_job_pools_its_own_rows_with_the_whole_tables_bits(tmp_path):
    """Every pooling path (torch's kernel; without torch, numpy's sums for a few pieces and scipy's product) gives a
    small job's vectors the torch model's bits from the rows the job reads, the float table unmade; the table is made
    once the rows read reach its size, and before workers fork."""
    path = paraphrastic.static.model_path(None)
    texts = generated_sentences(300, seed=7) + AWKWARD
    expected = models.load_model(path).embed_here(texts)
    model = paraphrastic.load_encoder(path)
    assert model.embed_here(texts).tobytes() == expected.tobytes() and model._table is None  # torch's kernel
    model.gathered = len(model.stored)  # as if this process had read as many rows as the table holds
    assert model.embed_here(texts).tobytes() == expected.tobytes() and model._table is not None
    np.save(tmp_path / "texts.npy", np.array(texts, dtype=object), allow_pickle=True)
    run_without_torch(f"""
        import numpy as np
        import paraphrastic
        texts = np.load({str(tmp_path / "texts.npy")!r}, allow_pickle=True).tolist()
        model = paraphrastic.load_encoder()
        few = np.concatenate([model.embed_here(texts[i : i + 3]) for i in range(0, len(texts), 3)])  # numpy's sums
        np.save({str(tmp_path / "rows.npy")!r}, np.stack([few, model.embed_here(texts)]))  # then scipy's product
        assert model._table is None
    """)
    few, product = np.load(tmp_path / "rows.npy")
    assert few.tobytes() == expected.tobytes() and product.tobytes() == expected.tobytes()
    model = paraphrastic.load_encoder(path)
    with workers.Workers(model, 2) as pool:
        pool.start()
        assert model._table is not None


SOUP = "abcxyz ABC 0189 .,;'!?-  \t\u00a0\u200b\u0301éßÇœﬁ’“—日本語中文Ελληνικάعربيё😀𝔘\ufffd\x01"


def soup(rng, n: int) -> list[str]:
    """`n` texts of characters drawn from SOUP (scripts, marks, spaces, controls), 0-40 long."""
    return ["".join(rng.choice(SOUP) for _ in range(rng.randrange(41))) for _ in range(n)]


@pytest.mark.parametrize("name", ["default", "multilingual"])
def test_a_cut_vocabulary_gives_the_whole_models_ids(name):
    """A small job's tokenizer holds only the pieces its texts can hold: every batch, real or a character soup,
    gets the ids of the whole model, which is never built."""
    import random

    tokenizer = paraphrastic.load_encoder(name).tokenizer
    whole = pieces.built(tokenizer.sp_model)
    rng = random.Random(0)
    texts = generated_sentences(200) + AWKWARD[:-1] + soup(rng, 400)
    rng.shuffle(texts)
    for start in range(0, len(texts), 7):
        batch = pieces.cased(texts[start : start + 7], tokenizer.lowercase)
        assert tokenizer.cut.encode(batch) == [whole.encode(text) for text in batch]
    assert "sp" not in vars(tokenizer) and len(tokenizer) == whole.get_piece_size()
    assert tokenizer.unk_id == whole.unk_id() and tokenizer.piece_id("\u2581") == whole.piece_to_id("\u2581")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=30), max_size=4))
def test_a_cut_vocabulary_gives_the_whole_models_ids_for_any_text(texts):
    tokenizer = cut_default()
    assert tokenizer.cut.encode(texts) == [cut_default.whole.encode(text) for text in texts]


def cut_default():
    """The shipped English model's tokenizer, once (hypothesis calls the test many times)."""
    if not hasattr(cut_default, "whole"):
        cut_default.tokenizer = paraphrastic.load_encoder("default").tokenizer
        cut_default.whole = pieces.built(cut_default.tokenizer.sp_model)
    return cut_default.tokenizer


def test_a_small_job_never_builds_the_whole_tokenizer_and_a_large_one_does(tiny_model_file):
    """Until SMALL_CHARS characters, the cut vocabulary; then, or before workers fork, the whole model, once: the same
    ids all along."""
    model = paraphrastic.load_encoder(tiny_model_file)
    texts = generated_sentences(20)
    small = model.tokenizer.encode(texts)
    assert "sp" not in vars(model.tokenizer) and 0 < model.tokenizer.cut_chars <= pieces.SMALL_CHARS
    large = model.tokenizer.encode(texts * (pieces.SMALL_CHARS // sum(map(len, texts)) + 1))
    assert "sp" in vars(model.tokenizer) and large[: len(texts)] == small
    for model in (paraphrastic.load_encoder(tiny_model_file), models.load_model(tiny_model_file)):
        assert "sp" not in vars(model.tokenizers[0])
        model.before_fork()
        assert "sp" in vars(model.tokenizers[0])


def test_models_a_cut_vocabulary_may_misread_get_no_index(corpus_file, sp_bytes):
    """No piece index for a model with user-defined pieces (matched before normalization) or another algorithm than
    unigram's; each then builds its whole model, as before."""
    import io

    import sentencepiece as spm

    assert pieces.piece_index(sp_bytes) is not None
    for options in ({"user_defined_symbols": ["foo"]}, {"model_type": "bpe"}):
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(input=str(corpus_file), model_writer=buf, vocab_size=120, hard_vocab_limit=False,
                                       num_threads=1, minloglevel=2, **options)  # fmt: skip
        assert pieces.piece_index(buf.getvalue()) is None
        assert "sp" in vars(pieces.Tokenizer(buf.getvalue(), lowercase=True))


@pytest.mark.parametrize("fault", ["size", "order", "ids", "always", "fewer", "missing"])
def test_a_piece_index_that_does_not_fit_its_model_is_one_error_naming_the_file(tiny_model, tmp_path, fault):
    index = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in tiny_model.sp_tokenizer.index.items()}
    if fault == "size":
        index["sizes"][3] += 1
    elif fault == "order":
        index["hashes"][[0, -1]] = index["hashes"][[-1, 0]]
    elif fault == "ids":
        index["ids"][0] = index["ids"][1]
    elif fault == "always":
        index["always"][0] = len(index["sizes"])
    elif fault == "fewer":  # the last piece left out of every array: the model's bytes still hold it
        last, kept = len(index["sizes"]) - 1, index["ids"] != len(index["sizes"]) - 1
        index |= {"sizes": index["sizes"][:-1], "hashes": index["hashes"][kept], "ids": index["ids"][kept]}
        index["always"] = index["always"][index["always"] != last]
    else:
        del index["hashes"]
    tiny_model.sp_tokenizer.index = index
    tiny_model.save(tmp_path / "bad.pt")
    for load in (paraphrastic.load_encoder, models.load_model):
        with pytest.raises(ModelError, match="bad.pt: its piece index does not fit its sentencepiece model"):
            load(tmp_path / "bad.pt")


def test_the_tokenizer_is_built_in_a_thread_while_the_table_is_read(tiny_model, tmp_path, monkeypatch):
    """For a model file without a piece index (saved before there was one), load_encoder starts sentencepiece's
    build as soon as the pickle is scanned, takes that tokenizer, and leaves no thread behind; a file whose
    sentencepiece bytes were changed after the scan is read with its own."""
    tiny_model.sp_tokenizer.index = None
    tiny_model.save(tiny_model_file := tmp_path / "tiny.pt")
    started, real = [], pieces.Tokenizer.in_thread
    monkeypatch.setattr(pieces.Tokenizer, "in_thread", lambda *a: started.append(real(*a)) or started[-1])
    threads = threading.active_count()
    model = paraphrastic.load_encoder(tiny_model_file)
    assert len(started) == 1 and model.tokenizer is started[0].made and threading.active_count() == threads
    state = checkpoint.read_checkpoint(tiny_model_file, early := [])
    early[0].sp_model = b"other bytes"  # as if the file had said otherwise on its second reading
    assert checkpoint.static_from_checkpoint(state, tiny_model_file, *early).tokenizer is not early[0].made


def test_a_model_file_with_broken_sentencepiece_bytes_is_one_error_from_the_thread(tiny_model, tmp_path):
    tiny_model.sp_tokenizer.sp_model = b"\x08broken"
    tiny_model.save(tmp_path / "broken.pt")
    threads = threading.active_count()
    with pytest.raises(ModelError, match="broken.pt: not a valid sentencepiece model"):
        paraphrastic.load_encoder(tmp_path / "broken.pt")
    assert threading.active_count() == threads


@pytest.mark.parametrize("scale", [np.inf, np.nan, 3e38])  # 3e38 x 127 overflows float32
def test_an_int8_model_whose_scales_make_its_table_non_finite_is_refused(scale):
    path = paraphrastic.static.model_path(None)  # int8: the table is checked through its scales, not row by row
    state = checkpoint.read_checkpoint(path)
    bits = (np.array([scale], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    state["embedding_scale"] = state["embedding_scale"].copy()
    state["embedding_scale"][123] = bits[0]
    with pytest.raises(ModelError, match="NaN or infinite"):
        checkpoint.static_from_checkpoint(state, path)


def test_mean_rows_kernels_agree_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((5000, 300)).astype(np.float32)
    table[rng.random(table.shape) < 0.05] = -0.0  # a sum of zeros has the sign that the kernels' sums from 0 give it
    lengths = rng.integers(1, 80, 4000)
    flat = rng.integers(0, len(table), lengths.sum())
    with_torch = static.mean_rows(table, flat, lengths)
    monkeypatch.setitem(sys.modules, "torch", None)
    assert static.mean_rows(table, flat, lengths).tobytes() == with_torch.tobytes()  # scipy's
    assert static.mean_rows(table, flat[:0], lengths[:0]).shape == (0, 300)
    monkeypatch.setattr(static, "gathered_seconds", 0.0)
    for bags in (1, 2, 3):  # under GATHER_PIECES pieces: numpy alone (gathered_means), no scipy needed
        few = lengths[:bags]
        assert few.sum() < static.GATHER_PIECES
        assert static.mean_rows(table, flat[: few.sum()], few).tobytes() == with_torch[:bags].tobytes()
    assert 0 < static.gathered_seconds < static.GATHER_SECONDS  # what it spent: past GATHER_SECONDS, scipy pools


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_numpy_sums_few_pieces_as_scipy_does(seed, dim, bags):
    """gathered_means (no scipy) against scipy's product, bit for bit: any width, bag lengths and values, zeros of
    both signs and values far apart in size among them."""
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((50, dim)) * 10.0 ** rng.integers(-6, 6, (50, 1))).astype(np.float32)
    zeros = rng.random(table.shape) < 0.2
    table[zeros] = np.where(rng.random(zeros.sum()) < 0.5, 0.0, -0.0)
    lengths = np.array(bags)
    flat = rng.integers(0, len(table), lengths.sum())
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "torch", None)
        patch.setattr(static, "gathered_seconds", static.GATHER_SECONDS)  # spent: scipy pools
        scipy_rows = static.mean_rows(table, flat, lengths)
    assert static.gathered_means(table, flat, lengths).tobytes() == scipy_rows.tobytes()


def test_unknown_pieces_are_counted_from_ids_as_by_hand():
    tokenizer = paraphrastic.load_encoder().tokenizer
    unk, space = tokenizer.unk_id, tokenizer.sp.piece_to_id("\u2581")
    assert tokenizer.sp.id_to_piece(space) == "\u2581"
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 6, 500)
    flat = rng.choice([unk, space, 20, 21], size=lengths.sum())
    by_hand = [2 * (bag == unk).sum() > (bag != space).sum() for bag in np.split(flat, np.cumsum(lengths)[:-1])]
    assert static.unknown_in(flat, lengths, tokenizer).tolist() == by_hand and 0 < sum(by_hand) < len(by_hand)
    assert not static.unknown_in(np.full(5, 20), np.array([2, 0, 3]), tokenizer).any()


def test_embed_counts_every_unknown_line_from_the_ids_it_embeds(tmp_path, monkeypatch):
    """Each line is tokenized once: the count of lines the model cannot read comes from the embedding's own ids,
    for all the lines (it was a sample, tokenized again)."""
    from paraphrastic.embed_sentences import embed_file

    model = paraphrastic.load_encoder()
    lines = ["a man plays a guitar", "今天天气很好", "", "the children swim"] * 250
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenized = []
    encode_flat = model.tokenizer.encode_flat
    monkeypatch.setattr(
        model.tokenizer, "encode_flat", lambda texts, *a: tokenized.append(len(texts)) or encode_flat(texts, *a)
    )
    stats = embed_file(model, tmp_path / "in.txt", tmp_path / "v.npy", batch_size=300, quiet=True, workers=1)
    assert stats["unknown_checked"] == 1000 and stats["mostly_unknown"] == 250 and sum(tokenized) == 1000
    words = [text for text in lines if text][:30]
    assert model.mostly_unknown(words).tolist() == [text == "今天天气很好" for text in words]


def test_score_counts_every_unknown_side_from_the_ids_it_embeds(tmp_path, monkeypatch, capsys):
    from paraphrastic import score_sentence_pairs

    (tmp_path / "pairs.tsv").write_text("a man plays a guitar\t今天天气很好\nthe kids swim\tchildren swim\n" * 500)
    tokenized = []
    encode_flat = pieces.Tokenizer.encode_flat
    monkeypatch.setattr(
        pieces.Tokenizer,
        "encode_flat",
        lambda self, texts, *a: tokenized.append(len(texts)) or encode_flat(self, texts, *a),
    )
    args = ["--sentence-pair-file", str(tmp_path / "pairs.tsv"), "--output-file", str(tmp_path / "scores.tsv")]
    assert score_sentence_pairs.main([*args, "--threads", "1", "--quiet"]) == 0
    assert "25.0% of the sentences checked (2000)" in capsys.readouterr().err and sum(tokenized) == 2000
    scores = [float(line.split("\t")[2]) for line in (tmp_path / "scores.tsv").read_text().splitlines()]
    model = paraphrastic.load_encoder()
    assert scores[:2] == [
        round(s, 6)
        for s in model.score_raw_text([("a man plays a guitar", "今天天气很好"), ("the kids swim", "children swim")])
    ]


def test_a_small_job_pools_without_importing_scipy(tmp_path):
    """The README's example, embedded and scored (--quiet), and one sentence encoded, pool with numpy alone and show
    no bar: scipy's import would be a quarter of such a command's start-up, tqdm's a twentieth; nor do they import
    numpy.ma (np.union1d's, a tenth) or build the whole sentencepiece model (a third)."""
    code = f"""
import sys
import paraphrastic
from paraphrastic import embed_sentences, score_sentence_pairs
assert embed_sentences.main(["--sentence-file", "{ROOT}/data/example-sentences.txt", "--output-file",
                             "{tmp_path}/v.npy", "--quiet"]) == 0
assert score_sentence_pairs.main(["--sentence-pair-file", "{ROOT}/data/example-sentences-pairs.txt", "--output-file",
                                  "{tmp_path}/s.tsv", "--quiet"]) == 0
model = paraphrastic.load_encoder()
model.encode("A man is playing a guitar.")
print(sorted(name for name in ("scipy.sparse", "torch", "tqdm", "numpy.ma") if name in sys.modules))
print("sp" in vars(model.tokenizer))
model.warm_up()  # a worker's, as it starts: the kernel of a job's batches is loaded before its first job
print(sorted(name for name in ("scipy.sparse", "torch", "tqdm") if name in sys.modules))
print("sp" in vars(model.tokenizer))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "[]\nFalse\n['scipy.sparse']\nTrue\n"


def test_every_commands_help_imports_neither_numpy_nor_torch_nor_gradio():
    """--help of each console command (setup.py's entry points) answers without numpy, torch or gradio: their
    imports are 0.1-1 s of a few hundredths' answer."""
    commands = re.findall(r'"(paraphrastic-[a-z]+) = paraphrastic\.(\w+):(\w+)"', (ROOT / "setup.py").read_text())
    assert len(commands) == 7
    for command, module, function in commands:
        code = f"""
import contextlib, io, sys
from paraphrastic.{module} import {function}
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    {function}(["--help"])
assert out.getvalue().startswith("usage: {command}"), out.getvalue()[:200]
print(sorted(name for name in ("numpy", "torch", "gradio", "sentencepiece") if name in sys.modules))
"""
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout) == (0, "[]\n"), (command, done.stderr[-2000:])


def test_small_jobs_never_import_torch_and_long_streams_switch_to_its_kernel(tiny_model_file, tmp_path):
    lines = tmp_path / "six.txt"
    lines.write_bytes(b"A man plays a guitar.\n\nSomeone plays music.\n\xff bad byte\nlast line without newline")
    (tmp_path / "pairs.tsv").write_text("a man\ta guy\nthe dog\tthe cat\n")
    pairs = zip(generated_sentences(300, seed=1), generated_sentences(300, seed=2), strict=True)
    (tmp_path / "many.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    (tmp_path / "data/sts/en/stsb").mkdir(parents=True)
    scored = zip(generated_sentences(20, seed=3), generated_sentences(20, seed=4), strict=True)
    (tmp_path / "data/sts/en/stsb/dev.tsv").write_text(
        "".join(f"{i % 6}\t{a}\t{b}\n" for i, (a, b) in enumerate(scored))
    )
    out = run_without_torch(f"""
        import sys
        import paraphrastic
        from paraphrastic import embed_sentences, score_sentence_pairs, static
        from paraphrastic import evaluate
        from paraphrastic.preprocess import steps  # preprocessing's sentencepiece step needs no torch either
        assert evaluate.main(["--data-dir", {str(tmp_path / "data")!r}, "--tasks", "stsb", "--load-file",
                              {str(tiny_model_file)!r}]) == 0
        assert steps.main(["train-sp", {str(tmp_path / "many.tsv")!r}, "--out", {str(tmp_path / "sp.model")!r},
                           "--vocab-size", "60"]) == 0
        embed_sentences.main(["--sentence-file", {str(lines)!r}, "--output-file", {str(tmp_path / "v.npy")!r},
                              "--load-file", {str(tiny_model_file)!r}, "--quiet"])
        score_sentence_pairs.main(["--sentence-pair-file", {str(tmp_path / "pairs.tsv")!r}, "--output-file",
                                   {str(tmp_path / "s.tsv")!r}, "--load-file", {str(tiny_model_file)!r}, "--quiet"])
        print("default", type(paraphrastic.load_encoder(None)).__name__)
        try:
            paraphrastic.load_encoder({str(tmp_path / "nope.pt")!r})
        except paraphrastic.fileio.ModelError as e:
            print("missing", e)
    """)
    assert "default SPEncoder" in out and "nope.pt: no such model file" in out and "dev           20" in out
    assert len(models.Tokenizer((tmp_path / "sp.model").read_bytes(), lowercase=True)) > 30
    torch_model = models.load_model(tiny_model_file)
    from paraphrastic.fileio import read_lines

    expected = torch_model.embed_here(read_lines(lines))
    assert np.load(tmp_path / "v.npy").tobytes() == expected.tobytes()
    assert (tmp_path / "s.tsv").read_text().count("\n") == 2
    switched = run_without_torch(f"""
        import sys
        sys.meta_path.pop(0)  # torch importable again: the stream below is long enough to want it
        import paraphrastic
        from paraphrastic import static
        static.TORCH_FROM = 1000
        model = paraphrastic.load_encoder({str(tiny_model_file)!r})
        model.embed_here(["warm up"] * 999)
        print("before", "torch" in sys.modules)
        model.embed_here(["one more batch"] * 10)
        print("after", "torch" in sys.modules)
    """)
    assert "before False" in switched and "after True" in switched


def test_other_models_and_damaged_files_go_to_the_torch_loader(tmp_path, sp_bytes):
    from paraphrastic.encoders import WordTokenizer

    words = WordTokenizer(["a", "man"], True)
    word = models.Model([words], ["mean"], torch.randn(len(words), 4))
    word.save(tmp_path / "word.pt")
    assert isinstance(paraphrastic.load_encoder(tmp_path / "word.pt"), models.Model)
    class_payload = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "config": {"lowercase": True}, "x": ModelError("not data")}, class_payload)
    with pytest.raises(ModelError, match="refused to load"):
        paraphrastic.load_encoder(class_payload)
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(ModelError, match="not a readable model file"):
        paraphrastic.load_encoder(tmp_path / "junk.pt")


def test_threads_set_before_torch_is_loaded_still_hold_for_a_torch_model(tmp_path):
    from paraphrastic.encoders import WordTokenizer

    words = WordTokenizer(["a", "man"], True)
    models.Model([words], ["mean"], torch.randn(len(words), 4)).save(tmp_path / "word.pt")
    (tmp_path / "in.txt").write_text("a man\n" * 50)
    out = run_without_torch(f"""
        import sys
        sys.meta_path.pop(0)  # torch importable: the word model loads through torch, after --threads was read
        from paraphrastic import embed_sentences, workers
        sizes = []
        embed_sentences.Workers = lambda model, size: sizes.append(size) or workers.Workers(model, size)
        embed_sentences.main(["--sentence-file", {str(tmp_path / "in.txt")!r}, "--output-file",
                              {str(tmp_path / "v.npy")!r}, "--load-file", {str(tmp_path / "word.pt")!r},
                              "--threads", "1", "--quiet"])
        print("workers", sizes, "torch threads", sys.modules["torch"].get_num_threads())
    """)
    assert "workers [1] torch threads 1" in out
