"""Export to sentence-transformers / model2vec folders and import back (needs `pip install "paraphrastic[interop]"`)."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # every load below is from a local folder; never reach the network

import numpy as np
import pytest
import torch
from conftest import ROOT, generated_sentences, need, shared_data_or_skip

from paraphrastic import interop, models, pieces, static, train

sentence_transformers = model2vec = None  # imported by `libraries` when the first test here runs


@pytest.fixture(scope="module", autouse=True)
def libraries() -> None:
    """The interop extra's libraries, imported (or skipped) when the module's first test runs, not where the module
    is collected: sentence-transformers takes seconds to import, and every xdist worker collects every module."""
    global sentence_transformers, model2vec
    sentence_transformers, model2vec = need("sentence_transformers"), need("model2vec")
    need("safetensors"), need("tokenizers")


LANGS = ("deu", "fra", "rus", "cmn", "ara")  # 100 English and 100 foreign Tatoeba lines each: 1,000 sentences


@pytest.fixture(scope="module")
def real_sentences() -> list[str]:
    tatoeba = shared_data_or_skip() / "tatoeba"
    out = []
    for lang in LANGS:
        for side in ("eng", lang):
            out += (tatoeba / f"{lang}-eng.{side}").read_text(encoding="utf-8").splitlines()[:100]
    assert len(out) == 1000 and all(out)
    return out


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory) -> models.SPModel:
    """A few margin-loss steps on real caption pairs, with a lowercasing sentencepiece model trained on them."""
    out = tmp_path_factory.mktemp("trained")
    source = shared_data_or_skip() / "train" / "en_paraphrase" / "multi30k_task2_en_captions.pairs.tsv.gz"
    with gzip.open(source, "rt", encoding="utf-8") as f:
        (out / "pairs.tsv").write_text("".join(itertools.islice(f, 3000)), encoding="utf-8")
    args = [
        "--train-file",
        out / "pairs.tsv",
        "--output-dir",
        out,
        "--vocab-size",
        "1000",
        "--dim",
        "32",
        "--threads",
        "1",
    ]
    assert train.main([*map(str, args), "--max-steps", "5", "--megabatch-size", "1", "--log-every", "5"]) == 0
    return models.load_model(out / "model.pt")


@pytest.fixture(scope="module")
def cased_model(tmp_path_factory, real_sentences) -> models.SPModel:
    """Lowercasing off, a sentencepiece model over the six languages (so few characters are unknown)."""
    text = tmp_path_factory.mktemp("cased") / "text.txt"
    text.write_text("\n".join(real_sentences) + "\n", encoding="utf-8")
    tokenizer = models.Tokenizer(pieces.train_sentencepiece(text, vocab_size=2000, num_threads=1), lowercase=False)
    return models.SPModel(tokenizer, torch.randn(len(tokenizer), 24, generator=torch.Generator().manual_seed(0)))


def library_vectors(folder) -> tuple:
    """The vectors sentence-transformers and model2vec compute for texts, from the exported folder."""
    st = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    m2v = model2vec.StaticModel.from_pretrained(str(folder))
    return (
        lambda texts: st.encode(texts, batch_size=4096, convert_to_numpy=True),
        lambda texts: m2v.encode(texts, use_multiprocessing=False),
    )


def assert_libraries_match(model: models.SPModel, folder, texts: list[str]) -> None:
    """Same piece ids for every text, and per-sentence cosine >= 0.9999 in both libraries."""
    hf_ids = [e.ids for e in interop.hf_tokenizer(model.tokenizer).encode_batch(texts, add_special_tokens=False)]
    differing = [t for t, a, b in zip(texts, model.tokenizer.encode(texts), hf_ids, strict=True) if a != b]
    assert not differing, f"{len(differing)}/{len(texts)} token sequences differ, e.g. {differing[:3]}"
    ours = model.embed_raw_text(texts)
    for encode in library_vectors(folder):
        assert static.cosine(ours, encode(texts)).min() >= 0.9999


def test_trained_model_exports_to_both_libraries_and_back(trained_model, real_sentences, tmp_path):
    folder = interop.export_folder(trained_model, tmp_path / "exported")
    assert_libraries_match(trained_model, folder, real_sentences)
    back = models.load_model(folder)
    assert back.tokenizer.sp_model == trained_model.tokenizer.sp_model and back.tokenizer.lowercase
    np.testing.assert_array_equal(back.embed_raw_text(real_sentences), trained_model.embed_raw_text(real_sentences))


def test_round_trip_with_lowercasing_off(cased_model, real_sentences, tmp_path):
    folder = interop.export_folder(cased_model, tmp_path / "cased")
    assert_libraries_match(cased_model, folder, real_sentences + ["Paris", "PARIS", " Two  spaces\tand a tab "])
    back = models.load_model(folder)
    assert not back.tokenizer.lowercase
    assert not np.array_equal(*back.embed_raw_text(["Paris", "paris"]))
    torch.testing.assert_close(back.embedding.weight, cased_model.embedding.weight, rtol=0, atol=0)


def test_unknown_characters_and_empty_text(tiny_model, tmp_path):
    """Unknown characters average the unknown row in both libraries; an empty text is zeros there, ours unk."""
    texts = ["a man ☃☃ and 猫", "☃", "<s> </s> <unk>", "\ue000"]
    assert_libraries_match(tiny_model, interop.export_folder(tiny_model, tmp_path / "m"), texts)
    for encode in library_vectors(tmp_path / "m"):
        assert not encode(["", " "]).any()
    unk = tiny_model.embedding.weight[tiny_model.unk_row].detach().numpy()
    np.testing.assert_array_equal(tiny_model.embed_raw_text([""])[0], unk)


def test_folder_resaved_by_sentence_transformers_needs_its_sentencepiece_model(tiny_model, tmp_path):
    st = sentence_transformers.SentenceTransformer(str(interop.export_folder(tiny_model, tmp_path / "m")), device="cpu")
    st.save(str(tmp_path / "resaved"))
    with pytest.raises(models.ModelError, match="copy sentencepiece.model into it"):
        models.load_model(tmp_path / "resaved")
    shutil.copy(tmp_path / "m" / interop.SP_FILE, tmp_path / "resaved")
    texts = generated_sentences(50)
    np.testing.assert_array_equal(models.load_model(tmp_path / "resaved").embed_raw_text(texts), st.encode(texts))


def test_model2vec_vocabulary_quantization_is_folded_in(tiny_model, tmp_path):
    folder = interop.export_folder(tiny_model, tmp_path / "m")
    plain = model2vec.StaticModel.from_pretrained(str(folder))
    rng = np.random.default_rng(0)
    mapping = rng.integers(0, 10, len(tiny_model.tokenizer))
    quantized = model2vec.StaticModel(
        plain.embedding[:10], plain.tokenizer, token_mapping=mapping, weights=rng.random(len(mapping)), max_length=None
    )
    quantized.save_pretrained(tmp_path / "q")
    shutil.copy(folder / interop.SP_FILE, tmp_path / "q")
    texts = generated_sentences(50)
    ours = models.load_model(tmp_path / "q").embed_raw_text(texts)
    np.testing.assert_allclose(ours, quantized.encode(texts, use_multiprocessing=False), rtol=1e-5, atol=1e-6)


def test_foreign_and_broken_folders_give_clear_errors(tiny_model, tmp_path):
    from sentence_transformers.models import StaticEmbedding  # not an attribute until a submodule imports it
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    tokenizer = Tokenizer(WordPiece({"[UNK]": 0, "hello": 1, "##s": 2}, unk_token="[UNK]"))
    module = StaticEmbedding(tokenizer, embedding_weights=np.ones((3, 4), np.float32))
    sentence_transformers.SentenceTransformer(modules=[module], device="cpu").save(str(tmp_path / "wp"))
    with pytest.raises(models.ModelError, match="only static models built on a sentencepiece model .* WordPiece$"):
        models.load_model(tmp_path / "wp")
    with pytest.raises(models.ModelError, match="not a static-embedding model"):
        models.load_model(tmp_path)
    folder = interop.export_folder(tiny_model, tmp_path / "broken")
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100])
    with pytest.raises(models.ModelError, match="model.safetensors is not the file its config.json was exported"):
        models.load_model(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["paraphrastic"]["sha256"]  # as a folder another tool wrote: no checksums to go by
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(models.ModelError, match="model.safetensors: not a readable safetensors file"):
        models.load_model(folder)


def test_an_interrupted_export_over_another_is_refused(tiny_model, tmp_path, monkeypatch):
    folder = interop.export_folder(tiny_model, tmp_path / "m")
    other = models.SPModel(tiny_model.tokenizer, tiny_model.embedding.weight.detach() * 2)
    real = interop.atomic_output

    def dies_at_the_tokenizer(path, *args):
        if Path(path).name == "tokenizer.json":
            raise KeyboardInterrupt
        return real(path, *args)

    monkeypatch.setattr(interop, "atomic_output", dies_at_the_tokenizer)
    with pytest.raises(KeyboardInterrupt):
        interop.export_folder(other, folder, overwrite=True)  # model.safetensors is new, the rest old
    with pytest.raises(models.ModelError, match="interrupted export"):
        models.load_model(folder)
    monkeypatch.setattr(interop, "atomic_output", real)
    interop.export_folder(other, folder, overwrite=True)
    assert torch.equal(models.load_model(folder).embedding.weight, other.embedding.weight)


@pytest.mark.parametrize(
    "tensors, message",
    [
        ({"embeddings": np.full((5, 4), np.nan, np.float32)}, "NaN or infinite"),
        ({"embeddings": np.ones(20, np.float32)}, "expected a 2-D float table"),
        ({"embeddings": np.ones((5, 4), np.int32)}, "expected a 2-D float table"),
        ({"embeddings": np.ones((5, 4), np.float32), "mapping": np.array([0, 9])}, "mapping is not a list of rows"),
        ({"embeddings": np.ones((5, 4), np.float32), "weights": np.ones(3, np.float32)}, "one float per row"),
    ],
)
def test_malformed_folder_tables_give_clear_errors(tiny_model, tmp_path, tensors, message):
    from safetensors.numpy import save_file

    folder = interop.export_folder(tiny_model, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    del config["paraphrastic"]["sha256"]
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(models.ModelError, match=message):
        models.load_model(folder)


def test_train_init_from_an_exported_folder(tiny_model, tmp_path):
    folder = interop.export_folder(tiny_model, tmp_path / "m")
    pairs = zip(generated_sentences(300, 11), generated_sentences(300, 12), strict=True)
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    args = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / "run", "--init-from", folder]
    assert train.main([*map(str, args), "--max-steps", "3", "--megabatch-size", "1", "--threads", "1"]) == 0
    tuned = models.load_model(tmp_path / "run" / "model.pt")
    assert tuned.tokenizer.sp_model == tiny_model.tokenizer.sp_model and tuned.dim == tiny_model.dim
    assert not torch.equal(tuned.embedding.weight, tiny_model.embedding.weight)


def test_export_command(tiny_model_file, tmp_path, capsys):
    """The command exports our checkpoint where torch cannot be imported (it reads it without); a missing model, and
    an --output-dir that is a file, are one-line errors (in process, as is the subcommand of earlier versions)."""
    no_torch = "import sys; sys.modules['torch'] = None; from paraphrastic import interop; sys.exit(interop.main())"
    command = [sys.executable, "-c", no_torch, "--load-file", tiny_model_file, "--output-dir", tmp_path / "e"]
    done = subprocess.run(list(map(str, command)), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "e")) == sorted(
        ["config.json", "model.safetensors", "modules.json", "tokenizer.json", interop.SP_FILE]
    )
    assert interop.main(["--load-file", str(tmp_path / "missing.pt"), "--output-dir", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "missing.pt" in err and "default, multilingual" in err  # the shipped names
    (tmp_path / "taken").write_text("mine\n")
    assert interop.main(["--load-file", str(tiny_model_file), "--output-dir", str(tmp_path / "taken")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'taken'}: is a file; --output-dir takes a folder\n"
    assert (tmp_path / "taken").read_text() == "mine\n"
    assert interop.main(["export", "--load-file", str(tiny_model_file), "--output-dir", str(tmp_path / "old")]) == 0
    again = ["--load-file", str(tiny_model_file), "--output-dir", str(tmp_path / "old")]
    assert interop.main(again) == 2 and "holds an earlier export; give --overwrite" in capsys.readouterr().err
    assert interop.main([*again, "--overwrite"]) == 0


def test_the_torch_free_model_exports_and_a_folder_of_ones_own_files_is_refused(tmp_path):
    import paraphrastic

    static_export = interop.export_folder(paraphrastic.load_encoder(), tmp_path / "static")
    torch_export = interop.export_folder(models.load_model(), tmp_path / "torch")
    for name in interop.EXPORTED:  # the same folder, byte for byte, from either loader
        assert (static_export / name).read_bytes() == (torch_export / name).read_bytes()
    with pytest.raises(models.ModelError, match="holds an earlier export; give --overwrite to replace it"):
        interop.export_folder(paraphrastic.load_encoder(), static_export)  # never replaced unasked
    interop.export_folder(paraphrastic.load_encoder(), static_export, overwrite=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own file")
    with pytest.raises(models.ModelError, match="holds files of its own \\(notes.txt\\)"):
        interop.export_folder(paraphrastic.load_encoder(), mine)
    assert sorted(os.listdir(mine)) == ["notes.txt"]
