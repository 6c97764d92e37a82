"""evaluate.py: correlations, the paper's averaging protocols, Tatoeba retrieval, the readers of both
data layouts, the CLI, and (on ../shared/data) the official pair counts and a full run of a small model."""

from __future__ import annotations

import gzip
import itertools
import json
import random

import numpy as np
import pytest
import torch
from conftest import generated_sentences, need
from scipy.stats import pearsonr, spearmanr

from paraphrastic import evaluate, knn, models, options, pieces
from paraphrastic.fileio import InputError

# ----------------------------------------------------------------------------- fixtures


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def scored_rows(n, seed=0):
    """(score, s1, s2) rows of generated sentences; scores on the STS 0-5 scale."""
    rng = random.Random(seed)
    a, b = generated_sentences(n, seed), generated_sentences(n, seed + 1)
    return [(round(rng.uniform(0, 5), 2), x, y) for x, y in zip(a, b, strict=True)]


def tsv_lines(rows):
    return [f"{s}\t{x}\t{y}" for s, x, y in rows]


@pytest.fixture
def data_dir(tmp_path):
    """A tiny data folder in the ../shared/data layout: one set per task plus one Tatoeba language."""
    root = tmp_path / "data"
    write(root / "sts/en/2012/MSRpar.tsv", tsv_lines(scored_rows(40, 1)))
    write(root / "sts/en/2015/images.tsv", tsv_lines(scored_rows(30, 2)))
    write(root / "sts/2017/es-es.tsv", tsv_lines(scored_rows(20, 3)))
    write(root / "sts/en/stsb/dev.tsv", tsv_lines(scored_rows(25, 4)))
    write(root / "sts/en/sick/trial.tsv", tsv_lines(scored_rows(25, 5)))
    sentences = sorted(set(generated_sentences(200, 6)))[:50]
    write(root / "tatoeba/deu-eng.deu", [s.upper() for s in sentences])
    write(root / "tatoeba/deu-eng.eng", sentences)
    write(root / "pud/zho-eng.zho", [s.upper() for s in sentences[:30]])  # PUD names its Chinese zho
    write(root / "pud/zho-eng.eng", sentences[:30])
    write(root / "flores200_devtest/deu_Latn.devtest", [s.upper() for s in sentences[::-1]])
    write(root / "flores200_devtest/eng_Latn.devtest", sentences[::-1])
    return root


class Identity:
    """A model whose embedding of text i is a fixed random vector: only `embed_raw_text` (duck typing)."""

    def __init__(self):
        self.calls = []

    def embed_raw_text(self, texts):
        self.calls.append(list(texts))
        return np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in texts]).astype(np.float32)


# ----------------------------------------------------------------------------- correlations and protocols


def test_correlations_match_scipy():
    rng = np.random.default_rng(0)
    pred, gold = rng.normal(size=200), rng.uniform(0, 5, size=200)
    got = evaluate.correlations(pred, gold)
    assert got["pearson"] == pytest.approx(100 * pearsonr(pred, gold)[0], abs=1e-9)
    assert got["spearman"] == pytest.approx(100 * spearmanr(pred, gold)[0], abs=1e-9)
    assert got["n"] == 200
    assert np.isnan(evaluate.correlations(np.ones(5), gold[:5])["pearson"])  # constant scores: undefined


def test_score_sts_file_matches_scipy_on_cosines(tiny_model, tmp_path):
    rows = scored_rows(60)
    path = write(tmp_path / "set.tsv", tsv_lines(rows))
    cos = tiny_model.score_raw_text([(x, y) for _, x, y in rows])
    gold = [s for s, _, _ in rows]
    got = evaluate.score_sts_file(tiny_model, path)
    assert got["pearson"] == pytest.approx(100 * pearsonr(cos, gold)[0], abs=1e-6)
    assert got["spearman"] == pytest.approx(100 * spearmanr(cos, gold)[0], abs=1e-6)
    assert got["n"] == 60


def test_score_sts_file_embeds_each_distinct_sentence_once(tmp_path):
    path = write(tmp_path / "set.tsv", ["1.0\ta b\tc d", "2.0\tc d\ta b", "3.5\ta b\te f", "\ta b\tzz"])
    model = Identity()
    got = evaluate.score_sts_file(model, path)
    assert got["n"] == 3  # the unscored pair is dropped
    assert model.calls == [["a b", "c d", "e f"]]


def test_year_means_follow_the_protocol():
    """Per-year mean over datasets (unweighted), Avg. = mean of the year means."""
    sets = {
        "2012/a": {"pearson": 10.0, "spearman": 1.0, "n": 100},
        "2012/b": {"pearson": 30.0, "spearman": 3.0, "n": 900},  # size does not weigh
        "2013/c": {"pearson": 50.0, "spearman": 5.0, "n": 10},
        "2014/d": {"pearson": 60.0, "spearman": 6.0, "n": 10},
        "2014/e": {"pearson": 70.0, "spearman": 7.0, "n": 10},
        "2014/f": {"pearson": 80.0, "spearman": 8.0, "n": 10},
        "2015/g": {"pearson": 40.0, "spearman": 4.0, "n": 10},
        "2016/h": {"pearson": 0.0, "spearman": 0.0, "n": 10},
        "2016/i": {"pearson": 90.0, "spearman": 9.0, "n": 10},
    }
    years, avg = evaluate.year_means(sets)
    assert {y: v["pearson"] for y, v in years.items()} == {"2012": 20, "2013": 50, "2014": 70, "2015": 40, "2016": 45}
    assert years["2012"]["n"] == 1000 and years["2014"]["sets"] == 3
    assert avg["pearson"] == pytest.approx((20 + 50 + 70 + 40 + 45) / 5)
    assert avg["spearman"] == pytest.approx((2 + 5 + 7 + 4 + 4.5) / 5)
    assert avg["years"] == 5


def test_pooled_spearman_is_over_the_concatenation():
    rng = np.random.default_rng(1)
    scored = [(rng.normal(size=n), rng.uniform(0, 5, size=n)) for n in (30, 50)]
    want = 100 * spearmanr(np.concatenate([s[0] for s in scored]), np.concatenate([s[1] for s in scored]))[0]
    assert evaluate.pooled_spearman(scored) == pytest.approx(want)


# ----------------------------------------------------------------------------- tatoeba


def test_tatoeba_identity_embeddings_give_zero_error():
    x = np.random.default_rng(0).normal(size=(300, 32)).astype(np.float32)
    assert evaluate.retrieval_errors(x, x.copy()) == (0.0, 0.0)


def test_tatoeba_rotated_assignment_gives_the_expected_error():
    """Targets 0..9 rotated by one place: each of those 10 queries finds a wrong row, in both directions."""
    src = np.eye(100, dtype=np.float32)
    perm = np.arange(100)
    perm[:10] = np.roll(perm[:10], 1)
    to_tgt, from_tgt = evaluate.retrieval_errors(src, src[perm] * 3.0)  # scale: cosine ignores norms
    assert (to_tgt, from_tgt) == (10.0, 10.0)


def test_nearest_both_ways_is_exact_in_any_chunking():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(257, 16)), rng.normal(size=(300, 16))
    sim = knn.unit_rows(a) @ knn.unit_rows(b).T
    for chunk in (1, 64, 4096):
        a_to_b, b_to_a = knn.nearest_both_ways(a, b, chunk=chunk)
        np.testing.assert_array_equal(a_to_b, sim.argmax(axis=1))
        np.testing.assert_array_equal(b_to_a, sim.argmax(axis=0))


def test_nearest_ties_go_to_the_lowest_row():
    a = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    for chunk in (1, 4096):
        a_to_b, b_to_a = knn.nearest_both_ways(a, a, chunk=chunk)
        assert a_to_b.tolist() == [0, 0, 2] and b_to_a.tolist() == [0, 0, 2]


def test_nearest_with_faiss_agrees_with_torch(monkeypatch):
    need("faiss")
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(50, 16)), rng.normal(size=(400, 16))
    want = knn.nearest_both_ways(a, b)
    got = knn.nearest_both_ways(a, b, faiss_from=1)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


# ----------------------------------------------------------------------------- readers of both layouts


def as_tuples(p):
    return list(zip(p.s1, p.s2, p.gold.tolist(), strict=True))


def test_raw_sts_and_tsv_give_the_same_pairs(tmp_path):
    rows = scored_rows(12)
    gold = [str(s) if i % 4 else "" for i, (s, _, _) in enumerate(rows)]  # every 4th pair unscored
    write(tmp_path / "raw/STS.input.MSRpar.txt", [f"{x}\t{y}" for _, x, y in rows])
    write(tmp_path / "raw/STS.gs.MSRpar.txt", gold)
    write(tmp_path / "sts16/STS2016.input.headlines.txt", [f"{x}\t{y}\turl1\turl2" for _, x, y in rows])
    write(tmp_path / "sts16/STS2016.gs.headlines.txt", gold)
    kept = [(g, x, y) for g, (_, x, y) in zip(gold, rows, strict=True) if g]
    write(tmp_path / "set.tsv", [f"{g}\t{x}\t{y}" for g, x, y in kept])
    want = as_tuples(evaluate.read_sts_pairs(tmp_path / "set.tsv"))
    assert len(want) == 9
    assert as_tuples(evaluate.read_sts_pairs(tmp_path / "raw/STS.input.MSRpar.txt")) == want
    assert as_tuples(evaluate.read_sts_pairs(tmp_path / "sts16/STS2016.input.headlines.txt")) == want


def test_sts17_raw_gold_in_a_sibling_folder_and_shorter_than_the_input(tmp_path):
    """STS 2017: gold files live in STS2017.gs/; tr-en has 500 inputs but 250 scores (the first 250)."""
    rows = scored_rows(10)
    write(tmp_path / "STS2017.eval.v1.1/STS.input.track6.tr-en.txt", [f"{x}\t{y}" for _, x, y in rows * 2])
    write(tmp_path / "STS2017.gs/STS.gs.track6.tr-en.txt", [str(s) for s, _, _ in rows])
    write(tmp_path / "merged/STS.input.track6.tr-en.txt", [f"{x}\t{y}\t{s}" for s, x, y in rows])  # toolkit layout
    write(tmp_path / "tr-en.tsv", tsv_lines(rows))
    want = as_tuples(evaluate.read_sts_pairs(tmp_path / "tr-en.tsv"))
    assert as_tuples(evaluate.read_sts_pairs(tmp_path / "STS2017.eval.v1.1/STS.input.track6.tr-en.txt")) == want
    assert as_tuples(evaluate.read_sts_pairs(tmp_path / "merged/STS.input.track6.tr-en.txt")) == want
    found, _ = evaluate.find_sets(tmp_path, "sts17")
    assert found["tr-en"].name == "STS.input.track6.tr-en.txt"


def test_stsb_csv_and_sick_txt_give_the_same_pairs_as_tsv(tmp_path):
    rows = scored_rows(8)
    write(
        tmp_path / "STSBenchmark/sts-dev.csv",
        [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s}\t{x}\t{y}\tsrc\tsrc" for i, (s, x, y) in enumerate(rows)],
    )
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"
    write(
        tmp_path / "sick2014/SICK_trial.txt",
        [header] + [f"{i}\t{x}\t{y}\t{s}\tNEUTRAL" for i, (s, x, y) in enumerate(rows)],
    )
    write(tmp_path / "set.tsv", tsv_lines(rows))
    want = as_tuples(evaluate.read_sts_pairs(tmp_path / "set.tsv"))
    assert as_tuples(evaluate.read_sts_pairs(tmp_path / "STSBenchmark/sts-dev.csv")) == want
    assert as_tuples(evaluate.read_sts_pairs(tmp_path / "sick2014/SICK_trial.txt")) == want
    assert evaluate.find_sets(tmp_path, "stsb")[0] == {"dev": tmp_path / "STSBenchmark/sts-dev.csv"}
    assert evaluate.find_sets(tmp_path, "sick")[0] == {"trial": tmp_path / "sick2014/SICK_trial.txt"}


def test_senteval_raw_layout_is_found(tmp_path):
    rows = scored_rows(5)
    write(tmp_path / "STS12-en-test/test-gold/STS.input.surprise.OnWN.txt", [f"{x}\t{y}" for _, x, y in rows])
    write(tmp_path / "STS12-en-test/test-gold/STS.gs.surprise.OnWN.txt", [str(s) for s, _, _ in rows])
    write(tmp_path / "STS16-en-test/x/STS2016.input.plagiarism.txt", [f"{x}\t{y}" for _, x, y in rows])
    write(tmp_path / "STS16-en-test/x/STS2016.gs.plagiarism.txt", [str(s) for s, _, _ in rows])
    found, missing = evaluate.find_sets(tmp_path, "sts")
    assert set(found) == {"2012/OnWN", "2016/plagiarism"}
    assert "not distributed" in missing["2013/SMT"] and missing["2014/images"] == "not found, skipped"


def test_tatoeba_laser_names_are_found(tmp_path):
    write(tmp_path / "tatoeba.deu-eng.deu", ["a"])
    write(tmp_path / "tatoeba.deu-eng.eng", ["b"])
    assert evaluate.tatoeba_files(tmp_path, "deu") == (
        tmp_path / "tatoeba.deu-eng.deu",
        tmp_path / "tatoeba.deu-eng.eng",
    )
    assert evaluate.tatoeba_langs(tmp_path) == ["deu"]


def test_bad_lines_name_the_file_and_line(tmp_path):
    with pytest.raises(InputError, match=r"set.tsv:2: expected score"):
        evaluate.read_sts_pairs(write(tmp_path / "set.tsv", ["1.0\ta\tb", "1.0\tonly two"]))
    with pytest.raises(InputError, match=r"bad.tsv:1: gold score 'high'"):
        evaluate.read_sts_pairs(write(tmp_path / "bad.tsv", ["high\ta\tb"]))
    write(tmp_path / "t.deu", ["a", "b"])
    with pytest.raises(InputError, match="line i must translate line i"):
        evaluate.parallel_lines(tmp_path / "t.deu", write(tmp_path / "t.eng", ["a"]))


# ----------------------------------------------------------------------------- CLI


def test_cli_writes_json_and_the_tables(tiny_model_file, data_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["--load-file", str(tiny_model_file), "--data-dir", str(data_dir), "--json", str(out), "--compare"]
    assert evaluate.main(argv + ["--langs", "deu"]) == 0
    printed = capsys.readouterr().out
    for text in ("Table 2", "2013 SMT", "not distributed", "Table 3", "STS Benchmark", "SICK-R", "Table 4", "74.6"):
        assert text in printed
    r = json.loads(out.read_text())
    assert r["sts"]["sets"]["2012/MSRpar"]["n"] == 40 and r["sts"]["years"]["2015"]["n"] == 30
    assert set(r["sts"]["years"]) == {"2012", "2015"} and r["sts"]["avg"]["years"] == 2
    assert r["sts17"]["sets"]["es-es"]["n"] == 20 and "ar-ar" in r["sts17"]["missing"]
    assert r["stsb"]["sets"]["dev"]["n"] == 25 and r["stsb"]["missing"] == {"test": "not found, skipped"}
    assert r["sick"]["sets"]["trial"]["n"] == 25
    assert r["tatoeba"]["langs"]["deu"]["n"] == 50 and r["tatoeba"]["avg"]["langs"] == 1
    assert r["paper_sp"]["sts"]["avg"] == 74.6
    with pytest.raises(SystemExit) as stop:  # Tatoeba's languages without Tatoeba: named, where it was ignored
        evaluate.main(argv + ["--tasks", "sts,stsb", "--langs", "deu"])
    assert stop.value.code == 2 and "error: --tasks sts,stsb does not take --langs (" in capsys.readouterr().err


def test_cli_pud_and_flores_retrieval_both_directions(tiny_model_file, data_dir, tmp_path, capsys):
    """The upper-cased side embeds like the lower-cased one (the model lowercases): no error either way."""
    out = tmp_path / "r.json"
    argv = ["--load-file", str(tiny_model_file), "--data-dir", str(data_dir), "--json", str(out)]
    assert evaluate.main([*argv, "--tasks", "pud,flores"]) == 0
    printed = capsys.readouterr().out
    assert "PUD" in printed and "FLORES-200" in printed
    r = json.loads(out.read_text())
    assert r["pud"]["langs"]["cmn"] == {"xx_eng": 0.0, "eng_xx": 0.0, "mean": 0.0, "n": 30}
    assert r["flores"]["langs"]["deu"]["n"] == 50 and r["flores"]["avg"]["mean"] == 0.0
    assert "deu" in r["pud"]["missing"] and "cmn" in r["flores"]["missing"]


def test_cli_compare_leaves_out_the_papers_figures_beside_a_multilingual_model(tiny_model, data_dir, tmp_path, capsys):
    tiny_model.config["multilingual"] = True
    tiny_model.save(tmp_path / "multi.pt")
    argv = ["--load-file", str(tmp_path / "multi.pt"), "--data-dir", str(data_dir), "--tasks", "sts,tatoeba"]
    assert evaluate.main([*argv, "--compare"]) == 0
    printed = capsys.readouterr().out
    assert "paper SP" not in printed and "74.6" not in printed and "not of one model for many languages" in printed


def test_cli_notes_that_a_model_not_marked_multilingual_is_near_chance_across_languages(
    tiny_model, data_dir, tmp_path, capsys
):
    tiny_model.save(tmp_path / "mine.pt")
    argv = ["--load-file", str(tmp_path / "mine.pt"), "--data-dir", str(data_dir)]
    assert evaluate.main([*argv, "--tasks", "sts,tatoeba"]) == 0
    assert "mine.pt is not marked multilingual: a model trained on one language" in capsys.readouterr().out
    assert evaluate.main([*argv, "--tasks", "sts"]) == 0  # no task across languages: no note
    assert "multilingual" not in capsys.readouterr().out
    tiny_model.config["multilingual"] = True
    tiny_model.save(tmp_path / "multi.pt")
    assert evaluate.main(["--load-file", str(tmp_path / "multi.pt"), *argv[2:], "--tasks", "tatoeba"]) == 0
    assert "not marked multilingual" not in capsys.readouterr().out


def test_cli_sets_two_models_side_by_side(tiny_model, data_dir, tmp_path, capsys):
    tiny_model.save(tmp_path / "a.pt")
    tiny_model.embedding.weight.data.mul_(-1).add_(torch.randn_like(tiny_model.embedding.weight))
    tiny_model.save(tmp_path / "b.pt")
    argv = ["--load-file", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--data-dir", str(data_dir)]
    assert evaluate.main([*argv, "--tasks", "sts,tatoeba", "--json", str(tmp_path / "both.json")]) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("Side by side") :].splitlines()
    assert table[1].endswith("[1] " + str(tmp_path / "a.pt")) and table[2].endswith("[2] " + str(tmp_path / "b.pt"))
    assert table[3].split() == ["[1]", "[2]", "[2]-[1]"]  # each column names its model, however long the paths
    both = json.loads((tmp_path / "both.json").read_text())["models"]
    for label, figure in (("STS 2012-2016 avg (r)", both[str(tmp_path / "a.pt")]["sts"]["avg"]["pearson"]),):
        row = next(line for line in table if line.startswith(label)).split()
        b = both[str(tmp_path / "b.pt")]["sts"]["avg"]["pearson"]
        assert row[-3:] == [f"{figure:.1f}", f"{b:.1f}", f"{b - figure:+.1f}"]
    assert any(line.startswith("tatoeba deu (err)") for line in table)


def test_cli_missing_model_is_a_one_line_error(data_dir, tmp_path, capsys):
    assert evaluate.main(["--load-file", str(tmp_path / "nope.pt"), "--data-dir", str(data_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nope.pt" in err and err.count("\n") == 1


def test_cli_missing_sets_fail_only_when_asked_for(tiny_model_file, data_dir, tmp_path, capsys):
    base = ["--load-file", str(tiny_model_file), "--data-dir", str(data_dir)]
    assert evaluate.main(base + ["--tasks", "tatoeba", "--langs", "deu,xyz"]) == 2
    assert "xyz" in capsys.readouterr().err
    assert evaluate.main(base + ["--tasks", "stsb", "--require-all"]) == 2
    assert "missing test" in capsys.readouterr().err
    assert evaluate.main(base + ["--tasks", "stsb"]) == 0
    assert "not found, skipped" in capsys.readouterr().out
    (tmp_path / "elsewhere").mkdir()  # a folder without any set: a wrong --data-dir, never a run that reports nothing
    assert evaluate.main([*base[:3], str(tmp_path / "elsewhere"), "--tasks", "sts,stsb"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {tmp_path / 'elsewhere'}: none of the sets of sts,stsb is here")
        and err.count("\n") == 1
    )


# ----------------------------------------------------------------------------- ../shared/data


def test_shared_sts_pair_counts(shared_data):
    found, missing = evaluate.find_sets(shared_data, "sts")
    assert set(missing) == {"2013/SMT"}
    counts = {y: 0 for y in evaluate.STS_YEARS}
    for key, path in found.items():
        counts[key.split("/")[0]] += len(evaluate.read_sts_pairs(path).gold)
    assert counts == {"2012": 3108, "2013": 1500, "2014": 3750, "2015": 3000, "2016": 1186}


@pytest.fixture(scope="module")
def caption_model(tmp_path_factory):
    """A small model built in the test run: sentencepiece on 3000 real captions, a random table."""
    from conftest import shared_data_or_skip

    root = shared_data_or_skip()
    with gzip.open(root / "train/en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz", "rt", encoding="utf-8") as f:
        lines = [line.split("\t")[0].lower() for line in itertools.islice(f, 3000)]
    text = tmp_path_factory.mktemp("captions") / "captions.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenizer = models.Tokenizer(pieces.train_sentencepiece(text, vocab_size=1000, num_threads=2), lowercase=True)
    torch.manual_seed(0)
    return models.SPModel(tokenizer, torch.randn(len(tokenizer), 32))


def test_small_model_completes_every_set(caption_model, shared_data):
    langs = evaluate.tatoeba_langs(shared_data)
    assert len(langs) == 112
    r = evaluate.evaluate(caption_model, shared_data, list(options.TASKS), langs)
    assert {y: v["n"] for y, v in r["sts"]["years"].items()} == {
        "2012": 3108,
        "2013": 1500,
        "2014": 3750,
        "2015": 3000,
        "2016": 1186,
    }
    assert r["sts"]["avg"]["years"] == 5 and np.isfinite(r["sts"]["avg"]["pearson"])
    assert {k: m["n"] for k, m in r["sts17"]["sets"].items()} == {k: 250 for k in evaluate.STS17_TRACKS}
    assert r["stsb"]["sets"]["dev"]["n"] == 1500 and r["sick"]["sets"]["trial"]["n"] == 500
    assert r["tatoeba"]["avg"]["langs"] == 112 and not r["tatoeba"]["missing"]
    assert sum(m["n"] for m in r["tatoeba"]["langs"].values()) == 88877
    assert all(r["tatoeba"]["langs"][lang]["n"] == 1000 for lang in evaluate.DEFAULT_LANGS)
