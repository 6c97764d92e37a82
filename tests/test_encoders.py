"""The seed papers' other encoders: WORD, TRIGRAM, LSTM, BLSTM, GRAN and their sums and concatenations."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import generated_sentences

from paraphrastic import embed_sentences, encoders, models, score_sentence_pairs, static, train

WORDS = ["a", "man", "dog", "the", "runs"]


def word_model(dim: int = 6, pooling: str = "mean") -> models.Model:
    torch.manual_seed(0)
    tokenizer = encoders.WordTokenizer(WORDS)
    return models.Model([tokenizer], [pooling], torch.randn(len(tokenizer), dim))


def test_word_vocabulary_keeps_the_most_frequent_types_ties_by_type():
    texts = ["B a a c", "b d a", "c c B", "e"]  # after lowercasing: a 3, b 3, c 3, d 1, e 1
    assert encoders.build_vocab("word", [texts[:2], texts[2:]], max_types=4) == ["a", "b", "c", "d"]
    assert encoders.build_vocab("word", [texts], max_types=2) == ["a", "b"]
    assert encoders.build_vocab("word", [texts], max_types=2, lowercase=False) == ["a", "c"]  # a 3, c 3, B 2


def test_word_tokenizer_lowercases_splits_on_whitespace_and_maps_unknown_words_to_zero():
    tokenizer = encoders.WordTokenizer(WORDS)
    flat, lengths = tokenizer.encode_flat(["The  man\truns", "", "A cat."])
    assert lengths.tolist() == [3, 0, 2]
    assert flat.tolist() == [4, 2, 5, 1, 0]  # ids are 1 + the vocabulary index; "cat." is unknown
    assert len(tokenizer) == len(WORDS) + 1


def test_trigrams_pad_the_sentence_with_one_space_at_each_end():
    keys, lengths = encoders.trigram_keys(["ab", "", "xyz", "é😀"])
    assert lengths.tolist() == [2, 0, 3, 2]
    assert [encoders.trigram_text(int(k)) for k in keys] == [" ab", "ab ", " xy", "xyz", "yz ", " é😀", "é😀 "]


def test_trigram_tokenizer_vocabulary_and_unknown_trigrams():
    texts = ["ab ab", "Ab"]  # lowercased and padded: " ab ab " and " ab "
    vocab = encoders.build_vocab("trigram", [texts], max_types=2)
    assert vocab == [" ab", "ab "]  # 3 times each; "b a" once
    tokenizer = encoders.TrigramTokenizer(vocab)
    flat, lengths = tokenizer.encode_flat(["AB", "abc", ""])
    assert lengths.tolist() == [2, 3, 0]
    assert flat.tolist() == [1, 2, 1, 0, 0]  # " ab" "ab " | " ab" "abc"(unknown) "bc "(unknown)
    with pytest.raises(models.ModelError, match="three characters"):
        encoders.TrigramTokenizer(["abcd"])


def test_word_average_is_the_mean_of_the_word_rows_and_unknown_or_empty_use_row_zero():
    model = word_model()
    table = model.embedding.weight.detach().numpy()
    got = model.embed_raw_text(["the dog runs", "", "cat"])
    np.testing.assert_allclose(got[0], table[[4, 3, 5]].mean(0), rtol=1e-6)
    np.testing.assert_allclose(got[1], table[0], rtol=1e-6)
    np.testing.assert_allclose(got[2], table[0], rtol=1e-6)


def hand_lstm(lstm: torch.nn.LSTM, rows: np.ndarray, reverse: bool = False, every: bool = False) -> np.ndarray:
    """The LSTM equations run step by step in numpy; returns the mean hidden state over time (`every`:
    the state of each step)."""
    suffix = "_reverse" if reverse else ""
    w_ih, w_hh = (getattr(lstm, f"weight_{k}_l0{suffix}").detach().numpy() for k in ("ih", "hh"))
    bias = sum(getattr(lstm, f"bias_{k}_l0{suffix}").detach().numpy() for k in ("ih", "hh"))
    h = c = np.zeros(lstm.hidden_size)
    states = []
    for x in rows[::-1] if reverse else rows:
        i, f, g, o = np.split(w_ih @ x + w_hh @ h + bias, 4)
        sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        states.append(h)
    return np.array(states) if every else np.mean(states, axis=0)


@pytest.mark.parametrize("pooling", ["lstm", "blstm"])
def test_lstm_pooling_averages_hidden_states_over_time(pooling):
    model = word_model(pooling=pooling)
    lstm = model.lstms["0"]
    table = model.embedding.weight.detach().numpy().astype(np.float64)
    texts = ["the dog runs", "a man", "dog"]  # different lengths in one padded batch
    got = model.embed_raw_text(texts)
    for text, vector in zip(texts, got, strict=True):
        rows = table[model.token_ids([text])[0]]
        expect = hand_lstm(lstm, rows)
        if pooling == "blstm":
            expect = (expect + hand_lstm(lstm, rows, reverse=True)) / 2  # forward and backward averaged
        np.testing.assert_allclose(vector, expect, rtol=1e-4, atol=1e-6)
    assert got.shape == (3, 6)


def test_gran_gates_each_embedding_by_the_lstm_state_and_averages():
    model = word_model(pooling="gran")
    gran = model.lstms["0"]
    w, b = gran.gate.weight.detach().numpy().astype(np.float64), gran.gate.bias.detach().numpy()
    table = model.embedding.weight.detach().numpy().astype(np.float64)
    texts = ["the dog runs", "a man", "dog"]
    for text, vector in zip(texts, model.embed_raw_text(texts), strict=True):
        x = table[model.token_ids([text])[0]]
        h = hand_lstm(gran.lstm, x, every=True)
        gate = 1 / (1 + np.exp(-(np.concatenate([x, h], axis=1) @ w.T + b)))  # sigmoid(W_x x + W_h h + b)
        np.testing.assert_allclose(vector, (x * gate).mean(axis=0), rtol=1e-4, atol=1e-6)


def test_gran_with_its_gate_at_one_is_avg():
    gran, avg = word_model(pooling="gran"), word_model(pooling="mean")  # the same table (same seed)
    with torch.no_grad():
        gran.lstms["0"].gate.weight.zero_()
        gran.lstms["0"].gate.bias.fill_(1e4)  # sigmoid = 1 exactly in float32
    texts = ["the dog runs", "a man", "", "dog dog the"]
    np.testing.assert_allclose(gran.embed_raw_text(texts), avg.embed_raw_text(texts), rtol=1e-6, atol=1e-7)


def test_gran_hears_word_order_and_avg_does_not():
    gran, avg = word_model(pooling="gran"), word_model(pooling="mean")
    texts = ["the dog runs a man", "a man runs the dog"]
    g, a = gran.embed_raw_text(texts), avg.embed_raw_text(texts)
    np.testing.assert_allclose(a[0], a[1], rtol=1e-6)
    assert np.abs(g[0] - g[1]).max() > 1e-3


@pytest.mark.parametrize("combine", ["add", "concat"])
def test_combined_parts_are_added_or_concatenated(sp_bytes, combine):
    sp = models.Tokenizer(sp_bytes, lowercase=True)
    word, trigram = encoders.WordTokenizer(WORDS), encoders.TrigramTokenizer([" th", "the", "he "])
    parts = [sp, word, trigram]
    torch.manual_seed(1)
    table = torch.randn(sum(map(len, parts)), 4)
    model = models.Model(parts, ["mean", "mean", "lstm"], table, combine=combine)
    text = "The dog"
    one = []
    for k, tokenizer in enumerate(parts):
        alone = models.Model([tokenizer], [model.poolings[k]], table[model.starts[k] : model.starts[k + 1]])
        if k == 2:
            alone.lstms["0"].load_state_dict(model.lstms["2"].state_dict())
        one.append(alone.embed_raw_text([text])[0])
    expect = np.concatenate(one) if combine == "concat" else np.sum(one, axis=0)
    np.testing.assert_allclose(model.embed_raw_text([text])[0], expect, rtol=1e-5, atol=1e-6)
    assert model.dim == (12 if combine == "concat" else 4)


def counted(token_ids, seen: list, batch, *args):
    seen.append(len(batch))
    return token_ids(batch, *args)


def test_a_mean_model_takes_batches_of_min_batch_at_least_and_a_recurrent_one_as_asked(monkeypatch):
    """sentence-transformers' batch of 32 paid a tokenizer and a pooling call every 32 texts (half the speed) for
    the same rows: a model that pools by the mean takes MIN_BATCH at least; a recurrent one, whose batch is its
    memory, the batch asked for."""
    texts = [f"sentence {i} of a few words" for i in range(3000)]
    for pooling, sizes in (("mean", [1024, 1024, 952]), ("lstm", [32] * 93 + [24])):
        model, seen = word_model(pooling=pooling), []
        monkeypatch.setattr(model, "token_ids", functools.partial(counted, model.token_ids, seen))
        rows = model.encode(texts, batch_size=32)
        assert seen == sizes
        monkeypatch.setattr(static, "MIN_BATCH", 1)
        assert np.array_equal(rows, model.encode(texts, batch_size=32))
        monkeypatch.undo()


def test_interleave_and_split_parts_are_inverse():
    a = (np.array([1, 2, 3]), np.array([2, 0, 1]))
    b = (np.array([10, 11, 12, 13]), np.array([1, 2, 1]))
    flat, lengths = encoders.interleave([a, b])
    assert flat.tolist() == [1, 2, 10, 11, 12, 3, 13] and lengths.tolist() == [3, 2, 2]
    model = models.Model(
        [encoders.WordTokenizer(["x"] * 9), encoders.WordTokenizer(["y"] * 9)], ["mean"] * 2, torch.zeros(20, 2)
    )
    ids, offsets = model.rows_and_offsets(flat, lengths)
    (i0, o0), (i1, o1) = model.split_parts(ids, offsets)
    assert i0.tolist() == [1, 2, 3] and o0.tolist() == [0, 2, 2]
    assert i1.tolist() == [10, 11, 12, 13] and o1.tolist() == [0, 1, 3]


def test_scramble_permutes_tokens_within_each_bag_only():
    ids = torch.arange(40)
    offsets = torch.tensor([0, 10, 25, 30])
    assert torch.equal(train.scramble(ids, offsets, 0.0), ids)
    torch.manual_seed(0)
    mixed = train.scramble(ids, offsets, 1.0)
    bounds = [*offsets.tolist(), 40]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        assert sorted(mixed[lo:hi].tolist()) == list(range(lo, hi))
    assert not torch.equal(mixed, ids)


@pytest.fixture
def pairs_file(tmp_path):
    left, right = generated_sentences(300, seed=1), generated_sentences(300, seed=2)
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{a}\t{b}\n" for a, b in zip(left, right, strict=True)))
    return path


def train_args(pairs_file, out, model: str, *extra) -> list[str]:
    return [
        "--train-file", str(pairs_file), "--output-dir", str(out), "--model", model, "--dim", "8",
        "--vocab-size", "100", "--batch-size", "16", "--megabatch-size", "2", "--megabatch-anneal", "0",
        "--threads", "1", "--log-every", "5", *extra,
    ]  # fmt: skip


KINDS = ["word", "trigram", "lstm", "blstm-word", "gran", "gran-word", "word,trigram", "sp,lstm-trigram"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_trains_saves_and_runs_through_load_model_and_the_scripts(pairs_file, tmp_path, kind):
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, out, kind, "--max-steps", "6", "--combine", "concat")) == 0
    model = models.load_model(out / "model.pt")
    assert model.kind == kind.replace(",", "+") and type(model) is models.Model
    sentences = tmp_path / "s.txt"
    sentences.write_text("a man is riding\n\nthe quiet river\n")
    vectors = tmp_path / "v.npy"
    args = ["--sentence-file", str(sentences), "--load-file", str(out / "model.pt"), "--output-file", str(vectors)]
    assert embed_sentences.main(args) == 0  # the scripts run as files in test_scripts and test_hardening
    np.testing.assert_allclose(
        np.load(vectors), model.embed_raw_text(["a man is riding", "", "the quiet river"]), rtol=1e-5, atol=1e-6
    )
    scored = tmp_path / "scored.tsv"
    pairs = tmp_path / "p.txt"
    pairs.write_text("a man is riding\ta man rides\n")
    args = ["--sentence-pair-file", str(pairs), "--load-file", str(out / "model.pt"), "--output-file", str(scored)]
    assert score_sentence_pairs.main(args) == 0
    expect = model.score_raw_text([("a man is riding", "a man rides")])[0]
    assert float(scored.read_text().split("\t")[-1]) == pytest.approx(expect, abs=1e-5)


def test_lstm_training_moves_the_lstm_weights_and_resumes_bit_identically(pairs_file, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train.main(train_args(pairs_file, straight, "blstm", "--max-steps", "12")) == 0
    assert train.main(train_args(pairs_file, resumed, "blstm", "--max-steps", "6")) == 0
    assert train.main(train_args(pairs_file, resumed, "blstm", "--max-steps", "12", "--resume")) == 0
    a, b = (torch.load(d / "model.pt", weights_only=True) for d in (straight, resumed))
    assert torch.equal(a["embedding"], b["embedding"])
    assert all(torch.equal(a["lstm"][k], b["lstm"][k]) for k in a["lstm"])
    torch.manual_seed(train.parse_args(train_args(pairs_file, straight, "blstm")).seed)
    untrained = torch.nn.LSTM(8, 8, batch_first=True, bidirectional=True)
    assert not torch.equal(untrained.weight_hh_l0, a["lstm"]["0.weight_hh_l0"])
    assert a["config"]["training"]["args"]["scramble_rate"] == 0.3  # the LSTM default


def test_resume_refuses_another_encoder(pairs_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, out, "word", "--max-steps", "2")) == 0
    assert train.main(train_args(pairs_file, out, "trigram", "--max-steps", "4", "--resume")) == 2
    assert "--model word -> trigram" in capsys.readouterr().err


def test_shards_hold_sentencepiece_ids_so_other_tokens_are_refused(pairs_file, tmp_path, capsys):
    shard = tmp_path / "x.h5"
    shard.write_bytes(b"")
    args = [
        "--train-shards",
        str(shard),
        "--output-dir",
        str(tmp_path / "o"),
        "--model",
        "word",
        "--sp-model",
        str(shard),
    ]
    assert train.main(args) == 2
    assert "a word model trains from --train-file" in capsys.readouterr().err


def test_unknown_encoder_is_a_usage_error(pairs_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(train_args(pairs_file, tmp_path, "gru"))
    assert e.value.code == 2 and "unknown encoder 'gru'" in capsys.readouterr().err


def test_word_vocabulary_is_counted_on_both_sides_of_the_training_pairs(pairs_file, tmp_path):
    out = tmp_path / "run"
    assert train.main(train_args(pairs_file, out, "word", "--max-steps", "1", "--max-types", "5")) == 0
    counts = Counter(w for line in pairs_file.read_text().lower().splitlines() for w in line.split())
    expect = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
    assert torch.load(out / "model.pt", weights_only=True)["vocabs"] == [expect]


def test_only_sp_models_export_to_static_embedding_folders(tmp_path):
    from paraphrastic import interop

    with pytest.raises(models.ModelError, match="a word model cannot be exported"):
        interop.export_folder(word_model(), tmp_path / "out")
