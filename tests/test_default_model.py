"""The shipped English model: loads with no path, and reproduces the figures its model card states."""

import json

import pytest
from conftest import stated_figure
from dev_parts import dev_figures

from paraphrastic import evaluate, models, static


def test_default_model_is_shipped_small_and_loads_without_a_path():
    assert static.DEFAULT_MODEL.exists(), "data/models/default.pt is the shipped default model"
    assert static.DEFAULT_MODEL.stat().st_size <= 25 * 2**20
    model = models.load_model()
    assert model.embed_raw_text(["A man is playing a guitar."]).shape == (1, model.dim)


def test_default_model_reads_every_letter_digit_and_common_punctuation():
    tokenizer = models.load_model().tokenizer
    text = ["the quick brown fox jumps over the lazy dog 0 1 2 3 4 5 6 7 8 9 ? ! % $ & ; : /"]
    assert tokenizer.unk_id not in tokenizer.encode(text)[0]


def test_default_model_reads_accents_curly_quotes_and_dashes_as_their_ascii_forms():
    tokenizer = models.load_model().tokenizer
    assert tokenizer.encode(["Café “naïve” don’t 1990–95"]) == tokenizer.encode(['cafe "naive" don\'t 1990-95'])


def test_default_model_reproduces_its_sts_figure(shared_data, tmp_path):
    out = tmp_path / "eval.json"
    args = ["--tasks", "sts,stsb", "--data-dir", str(shared_data), "--json", str(out)]
    assert evaluate.main(args) == 0
    results = json.loads(out.read_text())
    assert results["sts"]["avg"]["pearson"] == pytest.approx(stated_figure("STS 2012-2016 average Pearson"), abs=0.5)
    assert results["stsb"]["sets"]["dev"]["pearson"] == pytest.approx(
        stated_figure("STS Benchmark dev Pearson"), abs=0.5
    )


def test_dev_parts_score_the_dev_sets_as_evaluate_does(shared_data):
    """scripts/dev_parts.py (the model card's forum figures): its whole-set figures are evaluate.py's, and the
    forum part is the harder one, as the card says."""
    model = models.load_model()
    figures = dev_figures(model, shared_data)
    stsb = shared_data / "sts" / "en" / "stsb" / "dev.tsv"
    assert figures["stsb-dev"] == pytest.approx(evaluate.score_sts_file(model, stsb)["pearson"], abs=1e-6)
    assert figures["mean"] == pytest.approx((figures["sts17-en"] + figures["stsb-dev"] + figures["sts12-train"]) / 3)
    assert figures["forum"] < min(figures["captions"], figures["news"])


def test_shipped_model_carries_nothing_of_the_machine_it_was_made_on():
    def strings(value):
        if isinstance(value, dict):
            return [s for k, v in value.items() for s in strings(k) + strings(v)]
        if isinstance(value, list | tuple):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    config = models.load_model().config
    assert not [s for s in strings(config) if s.startswith("/") or "/work/" in s or "/home/" in s]
