"""The multilingual model: distillation across a language pair, the shipped model by name, and the warning
an English-only model gives for text it cannot read."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, generated_sentences, stated_figure
from multilingual_targets import mix_teachers

from paraphrastic import evaluate, models, pieces, static, train

# A made-up second language for the fixture: every Latin letter written as a Cyrillic one, so that the two
# sides share no piece and only distillation can bring a sentence and its "translation" together.
CIPHER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "абцдефгхийклмнопярстуввхыз")


def test_distillation_pulls_a_foreign_side_toward_its_english_target(tmp_path):
    english = sorted(set(generated_sentences(400, 31)))[:150]
    foreign = [s.translate(CIPHER) for s in english]
    (tmp_path / "text.txt").write_text("\n".join(english + foreign) + "\n")
    sp = pieces.train_sentencepiece(tmp_path / "text.txt", 400, num_threads=1, character_coverage=1.0)
    tokenizer = models.Tokenizer(sp, lowercase=True)
    assert not any(tokenizer.unk_id in ids for ids in tokenizer.encode(foreign))
    table = np.random.default_rng(0).standard_normal((len(tokenizer), 16)).astype(np.float32) * 0.1
    models.SPModel(tokenizer, torch.from_numpy(table)).save(tmp_path / "init.pt")
    targets = np.random.default_rng(1).standard_normal((len(english), 16)).astype(np.float32)
    np.save(tmp_path / "targets.npy", np.concatenate([targets, targets]))  # both sides: the English target
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in zip(english, foreign, strict=True)))

    def foreign_cosine(model_file):
        vectors = models.load_model(model_file).embed_raw_text(foreign)
        return float(static.cosine(vectors, targets).mean())

    args = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / "run", "--init-from"]
    args += [tmp_path / "init.pt", "--distill", tmp_path / "text.txt", tmp_path / "targets.npy"]
    flags = ["--margin-weight", "0", "--max-steps", "80", "--megabatch-size", "1", "--lr", "0.05"]
    assert train.main([*map(str, args), *flags]) == 0
    assert foreign_cosine(tmp_path / "run/model.pt") > foreign_cosine(tmp_path / "init.pt") + 0.3
    trained = models.load_model(tmp_path / "run/model.pt")
    similarity = trained.similarity(foreign, english)
    assert np.mean(similarity.argmax(1) == np.arange(len(english))) > 0.5  # each finds its own English line


def test_a_second_teacher_is_mapped_into_the_first_ones_space_before_mixing():
    rng = np.random.default_rng(0)
    use = static.unit_rows(rng.standard_normal((400, 16)).astype(np.float32))
    image = use @ rng.standard_normal((16, 24)) + 3.0  # a second teacher that is an affine image of the first
    for weight in (0.5, 1.0):  # the map undoes it, so any mix is the first teacher's own vectors
        np.testing.assert_allclose(mix_teachers(use, image, weight), use, atol=1e-4)
    unrelated = mix_teachers(use, rng.standard_normal((400, 24)), 0.5)
    np.testing.assert_allclose(np.linalg.norm(unrelated, axis=1), 1.0, rtol=1e-5)
    assert np.abs(unrelated - use).max() > 0.1


@pytest.fixture(scope="module")
def multilingual():
    return models.load_model("multilingual")


def test_the_multilingual_model_loads_by_name_and_reads_raw_chinese(multilingual):
    assert multilingual.config["multilingual"] and static.model_path("multilingual").name == "multilingual.pt"
    chinese = ["今天天气很好，我们去公园散步吧。", "他在北京大学学习计算机科学。"]
    ids = multilingual.tokenizer.encode(chinese)
    assert all(len(row) >= 4 and multilingual.tokenizer.unk_id not in row for row in ids)
    assert not multilingual.mostly_unknown(chinese).any()
    english = models.load_model()
    assert english.mostly_unknown(chinese).all()


def test_english_model_warns_once_on_text_it_cannot_read_and_multilingual_does_not(tmp_path):
    lines = ["a man is playing a guitar\ta person plays the guitar"] * 3 + ["今天天气很好\tпогода хорошая"]
    (tmp_path / "pairs.tsv").write_text("\n".join(lines) + "\n")
    command = [
        sys.executable,
        str(ROOT / "score_sentence_pairs.py"),
        "--sentence-pair-file",
        str(tmp_path / "pairs.tsv"),
    ]
    english = subprocess.run([*command, "--quiet"], capture_output=True, text=True)
    assert english.returncode == 0 and english.stdout.count("\n") == 4
    assert english.stderr.count("warning:") == 1 and "25.0% of the sentences checked (8)" in english.stderr
    assert "--load-file multilingual" in english.stderr
    multi = subprocess.run([*command, "--quiet", "--load-file", "multilingual"], capture_output=True, text=True)
    assert multi.returncode == 0 and "warning" not in multi.stderr


def test_the_multilingual_model_reproduces_its_card(shared_data, tmp_path):
    out = tmp_path / "eval.json"
    args = ["--load-file", "multilingual", "--tasks", "sts17,tatoeba", "--data-dir", str(shared_data)]
    assert evaluate.main([*args, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    cross = np.mean([results["sts17"]["sets"][pair]["pearson"] for pair in ("ar-en", "es-en", "tr-en")])
    six = np.mean([results["tatoeba"]["langs"][lang]["mean"] for lang in ("ara", "deu", "spa", "fra", "rus", "tur")])
    assert cross == pytest.approx(stated_figure("Multilingual STS 2017 cross-lingual mean Pearson"), abs=0.1)
    assert six == pytest.approx(stated_figure("Multilingual Tatoeba error, mean of six"), abs=0.1)
