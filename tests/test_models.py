"""The SP encoder: pooling against hand computation, checkpoint round trips, safety of loading."""

import argparse
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import generated_sentences

import paraphrastic
from paraphrastic import checkpoint, models, pieces, static
from paraphrastic.models import ModelError, load_model


def hand_embedding(model: models.SPModel, text: str) -> np.ndarray:
    """Mean of the rows of the text's pieces, computed one piece at a time."""
    table = model.embedding.weight.detach().numpy()
    ids = model.tokenizer.sp.encode(text.lower() if model.tokenizer.lowercase else text)
    rows = [model.piece_rows[i] if model.piece_rows is not None else i for i in ids]
    rows = [r for r in rows if r >= 0] or [model.unk_row]
    return np.mean([table[r] for r in rows], axis=0)


def test_pooled_vector_matches_hand_computation(tiny_model):
    texts = ["A man is riding a red bicycle.", "the quiet river", "Zebra XYZ 42", ""]
    got = tiny_model.embed_raw_text(texts)
    assert got.dtype == np.float32 and got.shape == (4, tiny_model.dim)
    for text, row in zip(texts, got, strict=True):
        np.testing.assert_allclose(row, hand_embedding(tiny_model, text), rtol=1e-5, atol=1e-6)


def test_empty_text_gets_the_unknown_row(tiny_model):
    unk = tiny_model.embedding.weight[tiny_model.tokenizer.sp.unk_id()].detach().numpy()
    np.testing.assert_array_equal(tiny_model.embed_raw_text([""])[0], unk)


def test_lowercasing_follows_the_config(sp_bytes):
    table = torch.randn(len(models.Tokenizer(sp_bytes, True)), 8)
    lower = models.SPModel(models.Tokenizer(sp_bytes, lowercase=True), table)
    cased = models.SPModel(models.Tokenizer(sp_bytes, lowercase=False), table)
    a, b = lower.embed_raw_text(["THE WOMAN", "the woman"])
    assert np.array_equal(a, b)
    a, b = cased.embed_raw_text(["THE WOMAN", "the woman"])
    assert not np.array_equal(a, b)


def test_embeddings_independent_of_batch_size_and_order(tiny_model, monkeypatch):
    monkeypatch.setattr(static, "MIN_BATCH", 1)  # batches as small as asked
    texts = generated_sentences(300, seed=1) + ["", "x"]
    full = tiny_model.embed_raw_text(texts, batch_size=10_000)
    for batch_size in (1, 7, 64):
        np.testing.assert_array_equal(tiny_model.embed_raw_text(texts, batch_size=batch_size), full)
    perm = np.random.default_rng(0).permutation(len(texts))
    shuffled = tiny_model.embed_raw_text([texts[i] for i in perm])
    np.testing.assert_array_equal(shuffled, full[perm])


def test_scores_are_symmetric_cosines_in_range(tiny_model):
    pairs = list(zip(generated_sentences(50, 2), generated_sentences(50, 3), strict=True))
    scores = tiny_model.score_raw_text(pairs)
    back = tiny_model.score_raw_text([(b, a) for a, b in pairs])
    np.testing.assert_allclose(scores, back, atol=1e-7)
    assert all(-1.0 <= s <= 1.0 for s in scores)
    emb = tiny_model.embed_raw_text([pairs[0][0], pairs[0][1]])
    expect = emb[0] @ emb[1] / np.linalg.norm(emb[0]) / np.linalg.norm(emb[1])
    assert scores[0] == pytest.approx(float(expect), abs=1e-6)
    assert tiny_model.score_raw_text([("same words", "same words")])[0] == pytest.approx(1.0)


def test_save_load_round_trip_is_exact(tiny_model, tmp_path):
    path = tmp_path / "m.pt"
    tiny_model.save(path, extra_config={"train_args": argparse.Namespace(lr=0.001, note="x")})
    loaded = load_model(path)
    texts = generated_sentences(40, seed=4)
    np.testing.assert_array_equal(loaded.embed_raw_text(texts), tiny_model.embed_raw_text(texts))
    assert loaded.dim == 16 and loaded.config["train_args"] == {"lr": 0.001, "note": "x"}
    assert loaded.config["vocab_size"] == len(loaded.tokenizer)
    assert "dim=16" in repr(loaded) and "lowercase=True" in repr(loaded)
    assert not list(tmp_path.glob("*.tmp")), "no temporary file is left behind"


@pytest.mark.parametrize("precision, atol", [("float16", 2e-3), ("int8", 2e-2)])
def test_lower_precision_checkpoint_is_close(tiny_model, tmp_path, precision, atol):
    tiny_model.save(tmp_path / "h.pt", precision=precision)
    loaded = load_model(tmp_path / "h.pt")
    assert loaded.embedding.weight.dtype == torch.float32
    texts = generated_sentences(20, seed=5)
    np.testing.assert_allclose(loaded.embed_raw_text(texts), tiny_model.embed_raw_text(texts), atol=atol)


def test_int8_rows_are_within_half_a_step_and_a_quarter_of_the_bytes(tiny_model, tmp_path):
    table = tiny_model.embedding.weight.detach()
    values, scale = models.quantize_rows(table)
    assert values.dtype == torch.int8 and int(values.abs().max()) == 127
    assert torch.all((values.float() * scale - table).abs() <= scale / 2 + 1e-7)
    sizes = {}
    for precision in ("float32", "int8"):
        tiny_model.save(tmp_path / f"{precision}.pt", precision=precision)
        sizes[precision] = len(torch.load(tmp_path / f"{precision}.pt")["embedding"].numpy().tobytes())
    assert sizes["int8"] * 4 == sizes["float32"]


def test_unknown_precision_is_refused(tiny_model, tmp_path):
    with pytest.raises(models.ModelError, match="precision 'int4'"):
        tiny_model.save(tmp_path / "m.pt", precision="int4")
    assert not (tmp_path / "m.pt").exists()


class Payload:
    """Pickles to a call of os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_with_pickle_payload_is_refused(tiny_model, tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "config": {}, "embedding": torch.zeros(2, 2), "x": Payload(marker)}, evil)
    with pytest.raises(ModelError, match="refused to load"):
        load_model(evil)
    legacy_evil = tmp_path / "legacy_evil.pt"
    torch.save({"state_dict": {}, "vocab": {}, "args": Payload(marker)}, legacy_evil)
    with pytest.raises(ModelError, match="refused to load"):
        load_model(legacy_evil, sp_model=tmp_path / "none.model")
    assert not marker.exists(), "the payload must never run"


def test_truncated_and_foreign_files_give_clear_errors(tiny_model_file, tmp_path):
    data = tiny_model_file.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="truncated or corrupt"):
        load_model(tmp_path / "cut.pt")
    (tmp_path / "text.pt").write_text("a man\ta guy\n")  # e.g. the pairs file given as the model
    with pytest.raises(ModelError, match=r"text.pt: .* \(neither a zip archive nor a pickle\)$"):
        load_model(tmp_path / "text.pt")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(ModelError, match="not a paraphrastic model"):
        load_model(tmp_path / "other.pt")
    with pytest.raises(ModelError, match="no such model file"):
        load_model(tmp_path / "missing.pt")
    for given in ("", 123):  # not "." (a folder), not os.fspath's TypeError
        with pytest.raises(ModelError, match=f"no model named {given!r}: give a model file or folder, or a shipped"):
            paraphrastic.load_encoder(given)


def test_unavailable_cuda_is_a_clear_error(tiny_model_file):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ModelError, match="no CUDA device"):
        load_model(tiny_model_file, device="cuda")
    assert load_model(tiny_model_file, device="auto").device.type == "cpu"
    for device in ("bogus", 2.5):  # torch's own error lists every device type it knows
        with pytest.raises(ModelError, match=f"device {device!r} is none of cpu, cuda, cuda:N or auto"):
            paraphrastic.load_encoder(tiny_model_file, device=device)


def legacy_checkpoint(sp_bytes, tmp_path, drop_every=3):
    """A model in the original release layout, with a data-derived vocabulary missing some pieces."""
    sp_file = tmp_path / "legacy.model"
    sp_file.write_bytes(sp_bytes)
    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    pieces = [tokenizer.sp.id_to_piece(i) for i in range(len(tokenizer)) if i % drop_every]
    vocab = {piece: row for row, piece in enumerate(pieces)}
    vocab[models.LEGACY_UNK] = len(vocab)
    torch.manual_seed(1)
    weight = torch.randn(len(vocab), 12)
    args = argparse.Namespace(lower_case=True, dim=12, model="avg")
    path = tmp_path / "legacy.pt"
    torch.save({"state_dict": {"embedding.weight": weight}, "vocab": vocab, "args": args}, path)
    return path, sp_file, vocab, weight


def test_original_release_layout_matches_hand_computation(sp_bytes, tmp_path):
    path, sp_file, vocab, weight = legacy_checkpoint(sp_bytes, tmp_path)
    model = load_model(path, sp_model=sp_file)
    sp = model.tokenizer.sp
    texts = ["A Man is cooking some fresh bread", "", "qqqq"]
    got = model.embed_raw_text(texts)
    for text, row in zip(texts, got, strict=True):
        rows = [vocab[p] for p in sp.encode(text.lower(), out_type=str) if p in vocab]
        expect = weight[rows or [vocab[models.LEGACY_UNK]]].mean(0).numpy()
        np.testing.assert_allclose(row, expect, rtol=1e-5, atol=1e-6)
    with pytest.raises(ModelError, match="pass sp_model="):
        load_model(path)
    model.save(tmp_path / "converted.pt")
    np.testing.assert_array_equal(load_model(tmp_path / "converted.pt").embed_raw_text(texts), got)


def test_bags_take_slice_and_cat_match_a_per_bag_reference():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, 12)
    bags = models.Bags.of(rng.integers(0, 100, int(lengths.sum())), lengths)
    rows = [bags.ids[o : o + n].tolist() for o, n in zip(bags.offsets.tolist(), lengths.tolist(), strict=True)]

    def as_lists(b: models.Bags) -> list[list[int]]:
        ends = [*b.offsets.tolist()[1:], len(b.ids)]
        return [b.ids[o:e].tolist() for o, e in zip(b.offsets.tolist(), ends, strict=True)]

    assert as_lists(bags) == rows and bags.lengths().tolist() == lengths.tolist()
    idx = torch.tensor([7, 0, 7, 11, 3])
    assert as_lists(bags.take(idx)) == [rows[i] for i in idx.tolist()]
    assert as_lists(bags.slice(4, 9)) == rows[4:9] and as_lists(bags.slice(9, 12)) == rows[9:]
    assert as_lists(bags.slice(0, 2).cat(bags.slice(10, 12))) == rows[:2] + rows[10:]


def rare_marks_text(path: Path) -> Path:
    """Generated sentences where each digit, 'j', '?', '%', 'é', '’', '“' and '–' is rarer than coverage keeps."""
    lines = generated_sentences(3000, 5)
    lines = [f"{line} {i // 5 % 10}" if i % 5 == 0 else line for i, line in enumerate(lines)]  # each digit ~0.05%
    lines += ["was it jazz? café 100% don’t “go” 1990–95"] * 60  # as rare as a digit
    path.write_text("\n".join(lines).lower() + "\n")
    return path


def test_sentencepiece_keeps_every_ascii_letter_digit_and_punctuation_mark_however_rare(tmp_path, monkeypatch):
    def no_folder():  # a killed training would leave it in /tmp: only folding needs one
        raise AssertionError("a temporary folder made for training without folding")

    monkeypatch.setattr(pieces.tempfile, "TemporaryDirectory", no_folder)
    tokenizer = models.Tokenizer(
        pieces.train_sentencepiece(rare_marks_text(tmp_path / "t.txt"), 300, 1), lowercase=True
    )
    assert not any(tokenizer.unk_id in ids for ids in tokenizer.encode(["7", "j", "?", "%"]))
    assert tokenizer.encode(["é"])[0].count(tokenizer.unk_id) == 1  # other rare characters stay unknown


def test_a_folding_sentencepiece_model_reads_accents_curly_quotes_and_dashes_as_ascii(tmp_path):
    sp = pieces.train_sentencepiece(rare_marks_text(tmp_path / "t.txt"), 300, 1, folding=True)
    tokenizer = models.Tokenizer(sp, lowercase=True)
    folded, plain = tokenizer.encode(["Café don’t “go” 1990–95\u200b", 'cafe don\'t "go" 1990-95'])
    assert folded == plain and tokenizer.unk_id not in folded
    assert tokenizer.encode(["фото"])[0].count(tokenizer.unk_id) == 1  # other scripts stay unknown
