"""encode as a sentence-transformers user expects it: any iterable of strings (a generator streamed in bounded
memory, the same rows bit for bit), normalize_embeddings, convert_to_tensor, show_progress_bar, and errors that
name the bad item."""

import collections
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import paraphrastic
from paraphrastic import precision, static, workers
from paraphrastic.precision import PRECISIONS


@pytest.fixture(scope="module")
def model():
    return paraphrastic.load_encoder()


def stream(n: int):
    return (f"sentence number {i} is about a cat on a mat" for i in range(n))


def test_a_generator_gives_the_rows_of_the_list_bit_for_bit_through_the_workers(model, monkeypatch):
    monkeypatch.setattr(static, "STREAM_TEXTS", 25_000)  # several windows, each big enough for the workers
    workers.use_threads(2)
    try:
        as_list = model.encode(list(stream(60_000)))
        streamed = model.encode(stream(60_000))
        packed = model.encode(list(stream(60_000)), precision="binary", normalize_embeddings=True)  # by the workers
        unit = model.encode(list(stream(60_000)), normalize_embeddings=True)
        cut = model.encode(stream(60_000), precision="ubinary", truncate_dim=100)  # cut and packed by the workers
    finally:
        workers.use_threads(None)
    assert streamed.dtype == np.float32 and np.array_equal(as_list, streamed)
    assert np.array_equal(packed, precision.signs(as_list, "binary"))
    assert cut.shape == (60_000, 13) and np.array_equal(cut, precision.signs(as_list[:, :100]))
    assert np.array_equal(unit, as_list / np.maximum(np.linalg.norm(as_list, axis=1, keepdims=True), 1e-12))
    assert np.array_equal(model.encode(iter(["a cat", "a dog"])), model.encode(["a cat", "a dog"]))


MEMORY = """import sys
import torch  # imported first: a long stream switches to its pooling kernel, a fixed cost measured apart
from pathlib import Path
import paraphrastic
from paraphrastic import static, workers
workers.use_threads(1)
static.STREAM_TEXTS = 16_384  # a window of texts small beside the list of a million
model = paraphrastic.load_encoder(sys.argv[1])
model.table  # the float table, made before the count (the model's, at its first large job): not encode's memory
model.whole_tokenizers()  # so is the whole sentencepiece model, built at the first large job too
def kib(field):
    return int(Path("/proc/self/status").read_text().split(field + ":")[1].split()[0])
before = kib("VmRSS")
texts = (f"sentence number {i} is about a cat on a mat" for i in range(int(sys.argv[2])))
if sys.argv[4:] == ["list"]:  # held before the count starts: what is counted is encode's
    texts, before = list(texts), kib("VmRSS")
rows = model.encode(texts, precision=sys.argv[3] if sys.argv[3:] else "float32")
print((kib("VmHWM") - before) * 1024 - rows.nbytes, rows.shape[0])
"""


@pytest.mark.long
def test_a_streamed_million_costs_the_output_and_a_window_not_the_corpus(tiny_model_file):
    done = subprocess.run([sys.executable, "-c", MEMORY, str(tiny_model_file), "1000000"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    streamed, rows = map(int, done.stdout.split())
    corpus = sum(sys.getsizeof(text) for text in stream(1_000_000))  # what holding the texts alone would cost
    print(f"memory beyond the output: {streamed / 2**20:.0f} MiB streamed; the texts: {corpus / 2**20:.0f} MiB")
    assert rows == 1_000_000 and streamed < 64 << 20 < corpus  # a window of texts: the million alone exceed the bound


@pytest.mark.parametrize("texts", ["stream", "list"])
def test_rows_packed_to_bits_hold_the_packed_rows_not_the_floats(texts):
    """precision="ubinary" packs each batch's rows as they come, a stream's or a list's: 300,000 rows of the shipped
    model hold 9 MiB, where their floats would take 293 MiB."""
    done = subprocess.run([sys.executable, "-c", MEMORY, "default", "300000", "ubinary", texts],
                          capture_output=True, text=True, check=True)  # fmt: skip
    beyond, rows = map(int, done.stdout.split())
    print(f"memory beyond the packed rows: {beyond / 2**20:.0f} MiB; their floats: {rows * 256 * 4 / 2**20:.0f} MiB")
    assert rows == 300_000 and beyond < 64 << 20 < rows * 256 * 4


def test_precision_packs_signs_and_cuts_each_column_in_255_steps(model):
    texts = [f"{i} sentences, one of them the {i}th about a {'cat' if i % 3 else 'dog'}." for i in range(3000)]
    rows = model.encode(texts)
    ubinary = model.encode(texts, precision="ubinary")
    assert ubinary.dtype == np.uint8 and ubinary.shape == (3000, 32)
    assert np.array_equal(np.unpackbits(ubinary, axis=1).astype(bool), rows > 0)
    assert np.array_equal(model.encode(texts, precision="binary").view(np.uint8), ubinary ^ 0x80)
    uint8 = model.encode(texts, precision="uint8").astype(np.float32)
    low, high = rows.min(axis=0), rows.max(axis=0)
    step = (high - low) / 255
    assert (uint8.min(axis=0) == 0).all() and (uint8.max(axis=0) >= 254).all()  # each column's whole range (the
    # top value's step is 254 where (high - low) / step rounds below 255, as in sentence-transformers)
    assert (np.abs(low + (uint8 + 0.5) * step - rows) <= 0.5 * step * 1.001).all()  # each value in its step
    assert np.array_equal(model.encode(texts, precision="int8").view(np.uint8), uint8.astype(np.uint8) ^ 0x80)
    streamed = model.encode(iter(texts), precision="int8", normalize_embeddings=True)
    assert np.array_equal(streamed, model.encode(texts, precision="int8", normalize_embeddings=True))


def test_precision_gives_sentence_transformers_bytes(model):
    quantize_embeddings = pytest.importorskip("sentence_transformers.util.quantization").quantize_embeddings
    texts = list(stream(2000))
    for normalize in (False, True):
        rows = model.encode(texts, normalize_embeddings=normalize)
        for kind in PRECISIONS:
            ours = model.encode(texts, precision=kind, normalize_embeddings=normalize)
            theirs = quantize_embeddings(rows, precision=kind)
            assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), kind


def test_precision_and_device_errors_say_what_to_do(model):
    with pytest.raises(ValueError, match="precision 'float16' is none of float32, int8, uint8, binary, ubinary"):
        model.encode(["a"], precision="float16")
    with pytest.raises(ValueError, match="encode many texts together, not one"):
        model.encode("one", precision="int8")
    with pytest.warns(UserWarning, match="int8 steps from 3 rows"):
        model.encode(["one", "two", "three"], precision="int8")
    assert model.encode([], precision="binary").shape == (0, 32) and model.encode([], precision="int8").shape == (
        0,
        256,
    )
    assert model.encode(["a"], device="cpu").shape == model.encode(["a"], device=torch.device("cpu")).shape == (1, 256)
    with pytest.raises(
        ValueError, match=r"this model is on cpu and encode does not move it: load it with device='cuda'"
    ):
        model.encode(["a"], device="cuda")
    texts = list(stream(200))
    assert model.similarity(model.encode(texts, precision="int8"), texts).shape == (200, 200)  # int8: values, cosine
    with pytest.raises(
        ValueError, match="rows of 32 bytes are packed signs .* compare them by the share of their bits"
    ):
        model.similarity(model.encode(texts, precision="binary"), texts)
    assert model.similarity("a cat", "a dog").shape == (1, 1)  # one string: one row, as one vector is
    with pytest.raises(ValueError, match=r"vectors are rows \(n, values\) or one vector, not an array of shape"):
        model.similarity(np.ones((2, 2, 256), np.float32), texts)
    cut = model.encode(texts, precision="int8", truncate_dim=100)
    with pytest.raises(ValueError, match=r"int8 rows cut by truncate_dim .*\(rows\.astype\(np\.float32\)\)"):
        model.similarity(cut, cut)
    cut = cut.astype(np.float32)
    assert np.allclose(np.diag(model.similarity(cut, cut)), 1, atol=1e-6)  # read as values
    for side in (texts, model.encode(texts, truncate_dim=64)):  # a side of other lengths: what to do, not numpy's
        with pytest.raises(
            ValueError, match="vectors of 100 and (256|64) values: give both sides the same truncate_dim"
        ):
            model.similarity(cut, side)
        with pytest.raises(ValueError, match="vectors of 100 and (256|64) values"):
            model.similarity_pairwise(cut, side)


def test_sentence_transformers_encode_arguments(model, monkeypatch):
    """prompt, prompt_name, truncate_dim (before normalizing, as sentence-transformers cuts), a list of tensors for
    convert_to_numpy=False, and errors for what this model cannot give."""
    texts = list(stream(300))
    rows = model.encode(texts)
    assert np.array_equal(model.encode(texts, truncate_dim=64), rows[:, :64])
    assert np.array_equal(model.encode(texts, truncate_dim=np.int64(64)), rows[:, :64])
    cut = rows[:, :64] / np.maximum(np.linalg.norm(rows[:, :64], axis=1, keepdims=True), 1e-12)
    assert np.array_equal(model.encode(iter(texts), truncate_dim=64, normalize_embeddings=True), cut)
    asked = model.encode(["query: " + text for text in texts])
    assert not np.array_equal(asked, rows)
    assert np.array_equal(model.encode(texts, prompt="query: "), asked)
    assert np.array_equal(model.encode(iter(texts), prompt="query: "), asked)
    assert np.array_equal(model.encode(texts[0], prompt="query: "), asked[0])
    with pytest.raises(ValueError, match=r"prompt_name 'query' is none of this model's prompts \(it has none\)"):
        model.encode_query(texts, prompt_name="query")
    monkeypatch.setattr(model, "prompts", {"query": "query: "}, raising=False)
    assert np.array_equal(model.encode_query(texts, prompt_name="query"), asked)
    assert np.array_equal(model.encode(texts, prompt_name="query", prompt=""), rows)  # a prompt given wins
    with pytest.raises(TypeError, match=r"texts\[1\] is NoneType None, not a string"):
        model.encode(["a", None], prompt="query: ")
    tensors = model.encode(texts[:2], convert_to_numpy=False)
    assert isinstance(tensors, list) and all(isinstance(t, torch.Tensor) for t in tensors)
    assert np.array_equal(torch.stack(tensors).numpy(), rows[:2])
    for dims in (0, 257, 2.5, True):
        with pytest.raises(ValueError, match=f"truncate_dim {dims} is not a count of values from 1 to the rows' 256"):
            model.encode(texts, truncate_dim=dims)
    wrong = {  # arguments of the wrong kind, named before any text is read (not Python's own TypeErrors)
        "batch_size must be a count of texts, not str '32'": dict(batch_size="32"),
        "batch_size must be 1 or more, not 0": dict(batch_size=0),
        "prompt must be a string put before each sentence, not int 1": dict(prompt=1),
        r"pool must come from model.start_multi_process_pool\(\), not int 3": dict(pool=3),
    }
    for message, arguments in wrong.items():
        with pytest.raises((TypeError, ValueError), match=message):
            model.encode(iter(["a", None]), **arguments)
    assert np.array_equal(model.encode(texts, batch_size=np.int64(32)), rows)
    with pytest.raises(ValueError, match="output_value 'token_embeddings': this model gives sentence embeddings"):
        model.encode(texts, output_value="token_embeddings")
    assert model.encode(texts, precision=None).dtype == np.float32  # sentence-transformers' evaluators give None
    assert isinstance(model.similarity(rows[:3], rows), np.ndarray)
    assert model.similarity(rows[0], rows).shape == (1, 300)  # one vector: one row
    scores = model.similarity(torch.from_numpy(rows[:3]), rows)
    assert isinstance(scores, torch.Tensor) and np.array_equal(scores.numpy(), model.similarity(rows[:3], rows))


def test_sentence_transformers_utilities_and_evaluators_take_the_model(model):
    """sentence-transformers' own helpers and evaluators, called on this model as on theirs, give the figures that
    its cosines give."""
    util = pytest.importorskip("sentence_transformers.util")
    evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
    from scipy.stats import pearsonr, spearmanr

    texts = ["A man plays a guitar.", "Someone plays the guitar.", "A cat sleeps.", "The cat is asleep.", "Rain."]
    vectors = model.encode(texts)
    top = util.paraphrase_mining(model, texts)[0]
    best = max((model.similarity(vectors[i], vectors[j])[0, 0], i, j) for i in range(5) for j in range(i + 1, 5))
    assert top[1:] == list(best[1:]) and top[0] == pytest.approx(float(best[0]), abs=1e-6)
    gold = [0.9, 0.1, 0.8, 0.0]
    figures = evaluation.EmbeddingSimilarityEvaluator(texts[:4], texts[1:], gold, name="dev")(model)
    ours = [float(model.similarity(vectors[i], vectors[i + 1])[0, 0]) for i in range(4)]
    assert figures["dev_pearson_cosine"] == pytest.approx(pearsonr(gold, ours)[0], abs=1e-6)
    assert figures["dev_spearman_cosine"] == pytest.approx(spearmanr(gold, ours)[0], abs=1e-6)
    queries, corpus = {"q": "a guitar player"}, {str(i): text for i, text in enumerate(texts)}
    found = evaluation.InformationRetrievalEvaluator(queries, corpus, {"q": {"0", "1"}}, name="ir")(model)
    assert found["ir_cosine_accuracy@1"] == 1.0
    assert [(name, epoch) for name, _, epoch, _ in model.model_card_data] == [
        ("EmbeddingSimilarityEvaluator", -1),
        ("InformationRetrievalEvaluator", -1),
    ]
    assert model.model_card_data.base_model is None  # read by sentence-transformers' mine_hard_negatives cache
    assert model.max_seq_length == float("inf")  # as its static embeddings: every piece is read
    with pytest.raises(AttributeError, match="max_seq_length cannot be set to 128: this model reads every piece"):
        model.max_seq_length = 128


def test_sentence_transformers_pool_calls(model):
    """start_multi_process_pool(["cpu", "cpu"]) and encode_multi_process(sentences, pool), as sentence-transformers
    names them: two workers, the rows of encode."""
    texts = list(stream(3000))
    with model.start_multi_process_pool(["cpu", "cpu"]) as pool:
        assert pool.size == 2
        rows = model.encode_multi_process(texts, pool, chunk_size=100, normalize_embeddings=True)
    assert np.array_equal(rows, model.encode(texts, normalize_embeddings=True))
    with pytest.raises(ValueError, match=r"processes on this machine's CPU, one core each, not \['cuda:0'\]"):
        model.start_multi_process_pool(["cuda:0"])
    for count, error in ((0, "a pool needs 1 worker or more, not 0"), (-1, "1 worker or more, not -1")):
        with pytest.raises(ValueError, match=error):
            model.start_multi_process_pool(count)
    for given in ("cpu", 2.5):  # a string is not a list of devices (its letters are not devices)
        with pytest.raises(TypeError, match=f"give their count, or a list of 'cpu', one a worker; not .* {given!r}"):
            model.start_multi_process_pool(given)


def test_normalized_tensor_and_progress_bar(model, capsys):
    vectors = model.encode(["a man plays guitar", "someone plays a guitar"], normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    raw = model.encode(["a man plays guitar"])
    assert not np.isclose(np.linalg.norm(raw), 1)  # the model's own vectors are means, not unit length
    tensor = model.encode(["a man plays guitar"], convert_to_tensor=True, show_progress_bar=True)
    assert isinstance(tensor, torch.Tensor) and torch.equal(tensor, torch.from_numpy(raw))
    assert "1/1" in capsys.readouterr().err
    assert isinstance(model.encode(["a", "b"], convert_to_numpy=False), list) and model.encode("one").shape == (256,)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ([None, "a"], r"texts\[0\] is NoneType None, not a string"),
        ((t for t in ["a", "b", 3]), r"texts\[2\] is int 3, not a string"),
        ({"a": 1}, "not a dict"),
        ({"a", "b"}, "not a set"),
    ],
)
def test_a_bad_item_or_container_is_named(model, texts, message):
    with pytest.raises(TypeError, match=message):
        model.encode(texts)


def test_a_deque_is_encoded_and_a_lone_surrogate_is_named(model):
    texts = ["A man plays a guitar.", "Someone plays guitar."]
    np.testing.assert_array_equal(model.encode(collections.deque(texts)), model.encode(texts))
    with pytest.raises(ValueError, match=r"the text 'bad \\ud800 x' holds '\\ud800', a lone surrogate"):
        model.encode(["fine", "bad \ud800 x"])


def test_one_thread_freezes_what_it_held_only_while_it_embeds(model, monkeypatch):
    """A long embedding in the caller's own thread has collections skip the objects held before it (gc.freeze: a
    full collection walks the caller's list of texts at every pass), and undoes it after, also on an error; where
    objects were frozen already (a pre-forking server), they stay frozen, and nothing more is."""
    import gc

    seen, embed_here = [], type(model).embed_here

    def watched(self, texts, *args, **kwargs):
        seen.append(gc.get_freeze_count())
        if texts[0] == "fail":
            raise RuntimeError("failed while embedding")
        return embed_here(self, texts, *args, **kwargs)

    monkeypatch.setattr(type(model), "embed_here", watched)
    monkeypatch.setattr(static, "PARALLEL_MIN", 100)
    workers.use_threads(1)
    gc.unfreeze()  # what a command run earlier in this process froze (its main does)
    try:
        texts = list(stream(200))
        model.encode(texts)
        assert seen[-1] > 0 and gc.get_freeze_count() == 0
        with pytest.raises(RuntimeError, match="failed while embedding"):
            model.encode(["fail", *texts])
        assert seen[-1] > 0 and gc.get_freeze_count() == 0
        model.encode(texts[:50])  # too few to be worth it
        assert seen[-1] == 0
        gc.freeze()
        frozen = gc.get_freeze_count()
        model.encode(texts)  # a frozen object may die meanwhile (2 did once in a suite run): the count may fall
        assert frozen - 100 < seen[-1] <= frozen and frozen - 100 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
        workers.use_threads(None)


class Many:
    """A sequence of `n` texts made as they are read: a corpus too big for the rows of its vectors to fit."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, at):
        return ["a cat"] * len(range(self.n)[at]) if isinstance(at, slice) else "a cat"


@pytest.mark.skipif(open("/proc/sys/vm/overcommit_memory").read().strip() == "1", reason="memory always overcommitted")
def test_rows_that_cannot_fit_in_memory_are_a_clear_memory_error_before_any_work(model):
    """Four times this machine's memory of rows: the workers' output says so at once, in numpy's words for the one
    thread's, not as a bare 'Cannot allocate memory'."""
    n = 4 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (4 * model.dim)
    workers.use_threads(2)
    try:
        with pytest.raises(MemoryError, match=rf"Unable to allocate .* for encode's {n:,} rows of 256 float32: encode"):
            model.encode(Many(n))
    finally:
        workers.use_threads(None)
