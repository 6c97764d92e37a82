"""Preprocessing: each filter on hand-worked cases, dedup/shuffle invariants, verified downloads,
evaluation-data conversion, and both do_all.sh pipelines end to end on small local fixtures."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, generated_sentences, need

from paraphrastic.fileio import InputError
from paraphrastic.preprocess import download, filters, steps
from paraphrastic.preprocess.evaluation import download as eval_download
from paraphrastic.shards import Shard

# ------------------------------------------------------------------ trigram overlap (hand-worked)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        # 4 trigrams each (tie: the first is "shorter"); shared: "the cat sat", "cat sat on" -> 2/4
        ("the cat sat on the mat", "the cat sat on a mat", 0.5),
        # shorter side rule: a has 2 trigrams (x y z, y z w), b has 5; only "x y z" is shared -> 1/2, not 1/5
        ("x y z w", "x y z q r s t", 0.5),
        ("x y z q r s t", "x y z w", 0.5),
        # the shorter side is wholly inside the longer one
        ("a b c d e f g", "c d e", 1.0),
        # lowercased and tokenized: "The cat sat." -> the cat sat . ; its 2 trigrams vs 1 -> 1/1
        ("The cat sat.", "the cat sat", 1.0),
        # each trigram position of the shorter side counts: a b c d -> [a b c, b c d]; only the first occurs
        ("a b c d", "a b c a b c x", 0.5),
        # no shared trigram
        ("one two three four", "five six seven eight", 0.0),
        # empty cases: a side with no trigram (fewer than 3 tokens) gives 0
        ("hello there", "hello there my friend", 0.0),
        ("", "", 0.0),
        ("", "a b c", 0.0),
    ],
)
def test_trigram_overlap(a, b, expected):
    assert steps.trigram_overlap(a, b) == pytest.approx(expected)


def test_length_bounds_are_inclusive():
    assert steps.length_ok("w " * 5, 5, 40) and steps.length_ok("w " * 40, 5, 40)
    assert not steps.length_ok("w " * 4, 5, 40) and not steps.length_ok("w " * 41, 5, 40)
    assert steps.length_ok("don't stop-me now", 3, 3)  # untokenized: whitespace tokens


def paranmt_config(**kw) -> dict:
    return {"sim_low": 0.4, "sim_high": 1.0, "ovl": 0.7, "min_len": 5, "max_len": 40, "lid_model": None, **kw}


def test_paranmt_filters_count_each_drop_under_its_first_failing_filter():
    lines = [
        "The man is riding a red bike.\tA guy rides a bicycle that is red.\t0.8\n",  # kept (lowercased)
        "Too short here\tA guy rides a bicycle that is red.\t0.8\n",  # length (3 tokens)
        "The man is riding a red bike.\tA guy rides a bicycle that is red.\t0.3\n",  # similarity
        "The man is riding a red bike.\tthe man is riding a red bike !\t0.9\n",  # overlap 1.0
        "no tab score here\n",  # malformed
    ]
    steps._init_worker(paranmt_config())
    blob, stats = steps.filter_paranmt_chunk([s.encode() for s in lines])
    assert blob.decode() == "the man is riding a red bike.\ta guy rides a bicycle that is red.\n"
    assert stats == Counter(read=5, kept=1, length=1, similarity=1, overlap=1, malformed=1)


def test_bitext_filter_lowercases_and_bounds_the_english_length():
    steps._init_worker({"lang": "de", "min_len": 3, "max_len": 100})
    pairs = [("A  Man\tRuns.", "Ein Mann läuft."), ("Hi there", "Hallo du"), ("word " * 101, "x"), ("a b c", " ")]
    blob, stats = steps.filter_bitext_chunk(pairs)
    assert blob.decode() == "a man runs.\tein mann läuft.\n"
    assert stats == Counter(read=4, kept=1, length=2, empty=1)


def test_chinese_is_segmented_with_jieba():
    need("jieba")
    steps._init_worker({"lang": "zh", "min_len": 3, "max_len": 100})
    blob, _ = steps.filter_bitext_chunk([("The chef was found dead.", "厨师被发现死于旧金山。")])
    assert blob.decode().split("\t")[1].split() == ["厨师", "被", "发现", "死", "于", "旧金山", "。"]


# ------------------------------------------------------------------ language ID


@pytest.fixture(scope="session")
def lid_model(tmp_path_factory) -> Path:
    """A tiny fastText classifier (__label__en / __label__de) trained on real bitext sentences."""
    from conftest import shared_data_or_skip

    need("fasttext")
    import fasttext

    data = shared_data_or_skip() / "train" / "bitext" / "multi30k" / "en-de.train.tsv.gz"
    with gzip.open(data, "rt") as f:
        pairs = [line.rstrip("\n").split("\t") for _, line in zip(range(600), f, strict=False)]
    rows = [f"__label__en {en}" for en, _ in pairs] + [f"__label__de {de}" for _, de in pairs]
    random.Random(0).shuffle(rows)
    path = tmp_path_factory.mktemp("lid") / "train.txt"
    path.write_text("\n".join(rows) + "\n")
    model = fasttext.train_supervised(str(path), epoch=10, lr=0.5, minn=2, maxn=4, dim=16, verbose=0, thread=1)
    model.save_model(str(path.with_suffix(".bin")))
    return path.with_suffix(".bin")


def test_language_id_keeps_english_pairs_and_drops_others(lid_model):
    model = steps.load_lid(lid_model)
    assert steps.detect_languages(model, ["A dog is running in the snow.", "Ein Hund rennt im Schnee."]) == ["en", "de"]
    steps._init_worker(paranmt_config(lid_model=str(lid_model), ovl=1.0))
    lines = [
        "A young boy is playing in the water.\tA little child plays in the sea water.\t0.9\n",
        "A young boy is playing in the water.\tEin kleiner Junge spielt im Wasser am Strand.\t0.9\n",
    ]
    blob, stats = steps.filter_paranmt_chunk([s.encode() for s in lines])
    assert blob.decode().startswith("a young boy is playing") and blob.count(b"\n") == 1
    assert stats["language"] == 1 and stats["kept"] == 1


def test_missing_lid_model_is_a_clear_error(tmp_path):
    need("fasttext")
    with pytest.raises(InputError, match="no such fastText"):
        steps.load_lid(tmp_path / "lid.176.bin")


# ------------------------------------------------------------------ dedup, shuffle, sources


def test_dedup_keeps_exactly_one_copy_of_each_pair(tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    a.write_text("x\ty\nx\ty\nonly once\tz\nc\td\n")
    b.write_text("c\td\nc\td\nx\ty\n")
    stats = steps.dedup([a, b], tmp_path / "out.tsv")
    assert sorted((tmp_path / "out.tsv").read_text().splitlines()) == ["c\td", "only once\tz", "x\ty"]
    assert stats == {"read": 7, "duplicates": 4, "kept": 3}


def test_shuffle_is_a_permutation_across_buckets(tmp_path):
    src = tmp_path / "in.tsv"
    lines = [f"line {i}\tpair {i}\n" for i in range(5000)]
    src.write_text("".join(lines))
    stats = steps.shuffle(src, tmp_path / "out.tsv", seed=1, bucket_bytes=8 << 10)
    out = (tmp_path / "out.tsv").read_text().splitlines(keepends=True)
    assert stats["buckets"] > 5 and sorted(out) == sorted(lines) and out != lines
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".shuffle")]


def test_find_bitext_takes_tsv_aliases_and_moses_pairs_but_not_tatoeba(tmp_path):
    for rel in ["news/en-de.2019.tsv.gz", "ntrex/en-deu.tsv.gz", "tatoeba_challenge/en-deu.tsv.gz", "x/en-fr.tsv"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    (tmp_path / "opus").mkdir()
    for side in ("en", "de"):
        (tmp_path / "opus" / f"Tanzil.de-en.{side}").write_text("")
    found = {tuple(p.relative_to(tmp_path).as_posix() for p in s) for s in steps.find_bitext(tmp_path, "de")}
    assert found == {
        ("news/en-de.2019.tsv.gz",),
        ("ntrex/en-deu.tsv.gz",),
        ("opus/Tanzil.de-en.en", "opus/Tanzil.de-en.de"),
    }


# ------------------------------------------------------------------ downloads


def test_fetch_checks_checksum_and_never_leaves_a_bad_file(tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(3000))
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    with pytest.raises(InputError, match="sha256"):
        download.fetch(src.as_uri(), tmp_path / "bad" / "payload.bin", sha256="0" * 64)
    assert not list((tmp_path / "bad").iterdir())
    assert download.fetch(src.as_uri(), tmp_path / "ok.bin", sha256=good).read_bytes() == src.read_bytes()


def test_truncated_archive_is_detected(tmp_path):
    archive = tmp_path / "para-nmt-50m.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("para-nmt-50m/para-nmt-50m.txt", "a b c d e\tf g h i j\t0.5\n" * 1000)
    assert download.paranmt(tmp_path / "dl", archive).read_text().count("\n") == 1000
    archive.write_bytes(archive.read_bytes()[:-200])
    with pytest.raises(InputError, match="corrupt or truncated"):
        download.paranmt(tmp_path / "dl2", archive)
    assert download.paranmt(tmp_path, tmp_path / "dl" / "para-nmt-50m.txt").name == "para-nmt-50m.txt"


def test_evaluation_archives_convert_to_the_evaluate_layout(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    with zipfile.ZipFile(local / "STS2012-en-test.zip", "w") as z:
        z.writestr("test-gold/STS.input.surprise.OnWN.txt", "A  cat.\tA feline.\nA dog.\tA car.\n")
        z.writestr("test-gold/STS.gs.surprise.OnWN.txt", "4.2\n0\n")
        z.writestr("test-gold/STS.gs.SMT.txt", "1\n")  # gold without input: skipped
    with zipfile.ZipFile(local / "STS2016-en-test.zip", "w") as z:
        z.writestr("sts2016-english-with-gs-v1.0/STS2016.input.headlines.txt", "a\tb\turl1\turl2\nc\td\tu\tv\n")
        z.writestr("sts2016-english-with-gs-v1.0/STS2016.gs.headlines.txt", "5\n\n")  # unscored pair dropped
    with (
        zipfile.ZipFile(local / "sts2017.eval.v1.1.zip", "w") as ze,
        zipfile.ZipFile(local / "sts2017.gs.zip", "w") as zg,
    ):
        for track in eval_download.STS17_TRACKS:
            ze.writestr(f"STS2017.eval.v1.1/STS.input.{track}.txt", "English first.\tother side\nx\ty\n")
            zg.writestr(f"STS2017.gs/STS.gs.{track}.txt", "3\n")  # shorter gold: first lines only
    args = ["--out", str(tmp_path / "out"), "--local", str(local), "--only", "2012", "2016", "2017"]
    assert eval_download.run_cli(eval_download.main)(args) == 0
    out = tmp_path / "out" / "sts"
    assert (out / "en/2012/OnWN.tsv").read_text() == "4.2\tA cat.\tA feline.\n0.0\tA dog.\tA car.\n"
    assert sorted(p.name for p in (out / "en/2012").iterdir()) == ["OnWN.tsv"]
    assert (out / "en/2016/headlines.tsv").read_text() == "5.0\ta\tb\n"
    assert (out / "2017/tr-en.tsv").read_text() == "3.0\tother side\tEnglish first.\n"  # swapped to tr, en
    assert (out / "2017/es-en.tsv").read_text() == "3.0\tEnglish first.\tother side\n"  # track4a: not swapped


# ------------------------------------------------------------------ end to end


def run_do_all(script: str, args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "VOCAB_SIZE": "300", "SHARD_PAIRS": "150", "WORKERS": "2", **env}
    return subprocess.run(["bash", str(ROOT / "preprocess" / script), *args], env=full_env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def check_shards(out: Path, expected_pairs: int) -> list[Path]:
    paths = sorted((out / "shards").glob("shard-*.h5"))
    sp = (out / "sp.model").read_bytes()
    shards = [Shard(p, sp) for p in paths]
    assert sum(len(s) for s in shards) == expected_pairs and len(shards) > 1
    (src, src_len), (tgt, tgt_len) = shards[0].read(0, len(shards[0]))
    assert len(src_len) == len(tgt_len) == len(shards[0]) and src_len.min() > 0 and tgt_len.min() > 0
    return paths


def train_a_few_steps(out: Path, tmp_path: Path, mode: str) -> None:
    """The trainer reads the shards."""
    from paraphrastic import train

    args = ["--train-shards", out / "shards", "--sp-model", out / "sp.model", "--max-steps", 5, "--dim", 16,
            "--batch-size", 16, "--output-dir", tmp_path / "run", "--mode", mode, "--quiet"]  # fmt: skip
    assert train.main([str(a) for a in args]) == 0


def test_paranmt_do_all_end_to_end(tmp_path, lid_model):
    rng = random.Random(0)
    english = generated_sentences(900, seed=3)
    rows = [f"{a}\t{b}\t{rng.random():.3f}" for a, b in zip(english[::2], english[1::2], strict=True)]
    rows += rows[:40]  # duplicates: one copy must stay
    rows += ["Ein Mann fährt mit dem roten Fahrrad im Park.\tA man rides the red bicycle in the park.\t0.9"]
    (tmp_path / "para-nmt-50m.txt").write_text("\n".join(rows) + "\n")
    env = {"PARANMT_LOCAL": str(tmp_path / "para-nmt-50m.txt"), "LID_MODEL": str(lid_model)}
    done = run_do_all("paranmt/do_all.sh", ["0.4", "1.0", "0.7"], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "data" / "paranmt-sim-low=0.4-sim-high=1.0-ovl=0.7"
    stats = json.loads((out / "stats.json").read_text())
    f = stats["filter-paranmt"]
    assert f["read"] == len(rows) and f["language"] >= 1 and f["similarity"] > 0 and f["overlap"] > 0
    assert sum(f[k] for k in ("malformed", "length", "similarity", "overlap", "language", "kept")) == f["read"]
    assert stats["dedup"]["duplicates"] > 0
    kept = (out / "dedup.tsv").read_text().splitlines()
    assert len(kept) == len(set(kept)) == stats["dedup"]["kept"] and all(s == s.lower() for s in kept)
    check_shards(out, stats["dedup"]["kept"])
    again = run_do_all("paranmt/do_all.sh", ["0.4", "1.0", "0.7"], env, tmp_path)
    assert again.returncode == 0 and again.stderr.count("skipped") == 5
    train_a_few_steps(out, tmp_path, "paraphrase")


def test_bilingual_do_all_end_to_end_excludes_tatoeba(tmp_path):
    english = generated_sentences(600, seed=5)
    local = tmp_path / "bitext"
    (local / "news").mkdir(parents=True)
    (local / "tatoeba_challenge").mkdir()
    (local / "opus").mkdir()
    with gzip.open(local / "news" / "en-de.fixture.tsv.gz", "wt") as f:
        f.write("".join(f"{s}\tDE {s[::-1]}\n" for s in english[:300] + english[:20]))
    (local / "tatoeba_challenge" / "en-de.tsv").write_text("tatoeba only sentence here\tnur tatoeba\n")
    (local / "opus" / "Tanzil.en-fr.en").write_text("".join(f"{s}\n" for s in english[300:] + ["too short"]))
    (local / "opus" / "Tanzil.en-fr.fr").write_text("".join(f"FR {s.upper()}\n" for s in english[300:] + ["x"]))
    done = run_do_all("bilingual/do_all.sh", ["de-fr"], {"BITEXT_LOCAL": str(local)}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "data" / "bilingual-de-fr"
    stats = json.loads((out / "stats.json").read_text())
    assert stats["filter-bitext-de"]["read"] == 320 and stats["filter-bitext-fr"]["length"] == 1
    assert not any("tatoeba" in s for s in stats["filter-bitext-de"]["sources"])
    text = (out / "dedup.tsv").read_text()
    assert "tatoeba" not in text and text == text.lower()
    check_shards(out, stats["dedup"]["kept"])
    train_a_few_steps(out, tmp_path, "bitext")


def test_bilingual_do_all_rejects_bad_language_lists(tmp_path):
    done = run_do_all("bilingual/do_all.sh", ["de_fr"], {}, tmp_path)
    assert done.returncode == 2 and "usage" in done.stderr


# ------------------------------------------------------------------ damaged inputs: one line, nothing kept


def test_a_download_that_is_no_complete_archive_is_not_kept(tmp_path):
    archive = tmp_path / "served.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("x.txt", "text\n" * 1000)
    archive.write_bytes(archive.read_bytes()[:-100])  # cut short: its directory is gone
    with pytest.raises(InputError, match="not a complete archive"):
        download.fetch(archive.as_uri(), tmp_path / "dl" / "x.zip")
    assert list((tmp_path / "dl").iterdir()) == []


def test_garbage_evaluation_archives_are_one_line_errors(tmp_path, capsys):
    local = tmp_path / "local"
    local.mkdir()
    (local / "STS2012-en-test.zip").write_bytes(b"not a zip")
    (local / "Stsbenchmark.tar.gz").write_bytes(b"not a tar")
    with zipfile.ZipFile(local / "STS2013-en-test.zip", "w") as z:
        z.writestr("STS.input.headlines.txt", "a\tb\n")
        z.writestr("STS.gs.headlines.txt", "high\n")  # a score that is no number
    for only in ("2012", "stsb", "2013"):
        args = ["--out", str(tmp_path / "eval"), "--local", str(local), "--only", only]
        assert fileio_main(eval_download.main, args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "download it again" in err, err


def fileio_main(main, argv) -> int:
    from paraphrastic.cli import run_cli

    return run_cli(main)(argv)


@pytest.mark.parametrize("damage", ["no tab", "empty", "truncated gzip", "failed sort"])
def test_preprocessing_steps_fail_in_one_line(damage, tmp_path, capsys, sp_bytes):
    out, sp_file = tmp_path / "out", tmp_path / "sp.model"
    sp_file.write_bytes(sp_bytes)
    if damage == "no tab":
        (tmp_path / "pairs.tsv").write_text("a b\tc d\nno tab here\n")
        argv = ["encode", str(tmp_path / "pairs.tsv"), "--sp-model", str(sp_file), "--out", str(out)]
        want = "pairs.tsv:2: expected sentence1<TAB>sentence2"
    elif damage == "empty":
        (tmp_path / "pairs.tsv").write_text("")
        argv = ["train-sp", str(tmp_path / "pairs.tsv"), "--out", str(out)]
        want = "no text to train"
    elif damage == "truncated gzip":
        data = gzip.compress(("a b c d e f\tg h i j k\t0.5\n" * 5000).encode())
        (tmp_path / "p.txt.gz").write_bytes(data[: len(data) // 2])
        argv = ["filter-paranmt", str(tmp_path / "p.txt.gz"), "--sim-low", "0", "--sim-high", "1", "--ovl", "1", "--out", str(out), "--workers", "1"]  # fmt: skip
        want = "truncated or corrupt gzip"
    else:
        (tmp_path / "pairs.tsv").write_text("a\tb\n")
        argv = ["dedup", str(tmp_path / "pairs.tsv"), "--memory", "no-such-size", "--out", str(out)]
        want = "sort failed"
    assert fileio_main(steps.main, argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: ") and want in err, err
    assert not out.exists()


# ------------------------------------------------------------------ the back-translation paper's pair filters


def test_ngram_overlap_by_hand():
    a, b = filters.tokenize("A b c d"), filters.tokenize("a b x")
    assert filters.ngram_overlap(a, b, 1) == pytest.approx(2 / 3)  # b's unigrams a, b, x: two in a
    assert filters.ngram_overlap(a, b, 2) == pytest.approx(1 / 2)  # b's bigrams (a b), (b x): one in a
    assert filters.ngram_overlap(a, b, 3) == 0.0
    assert filters.ngram_overlap(a, [], 1) == 0.0


def test_sentence_bleu_by_hand():
    hyp, ref = "a b c d".split(), "a b c e".split()
    # precisions 3/4, (2+1)/(3+1), (1+1)/(2+1), (0+1)/(1+1); equal lengths: no brevity penalty
    assert filters.sentence_bleu(hyp, ref) == pytest.approx((0.75 * 0.75 * (2 / 3) * 0.5) ** 0.25)
    assert filters.sentence_bleu(hyp, hyp) == pytest.approx(1.0)
    short = "a b".split()  # brevity: exp(1 - 4/2)
    assert filters.sentence_bleu(short, ref) == pytest.approx(
        math.exp(1 - 2) * (1 * (2 / 2) * (1 / 1) * (1 / 1)) ** 0.25
    )
    assert filters.sentence_bleu(["z"], ref) == 0.0


def test_trigram_lm_by_hand():
    lm = filters.NgramLM([["a", "b"], ["a", "c"]])  # 6 tokens (</s> included), 4 types + unknown = 5
    assert lm.probability("<s>", "<s>", "a") == pytest.approx(0.6 * 1 + 0.3 * 1 + 0.1 * 3 / 11)
    assert lm.probability("<s>", "a", "b") == pytest.approx(0.6 * 1 / 2 + 0.3 * 1 / 2 + 0.1 * 2 / 11)
    assert lm.probability("a", "b", "</s>") == pytest.approx(0.6 + 0.3 + 0.1 * 3 / 11)
    assert lm.probability("b", "a", "z") == pytest.approx(0.9 * 0 + 0.1 * 1 / 11)  # unseen context and word
    want = math.exp(-(2 * math.log(0.9 + 0.3 / 11) + math.log(0.45 + 0.2 / 11)) / 3)
    assert lm.perplexity(["a", "b"]) == pytest.approx(want)
    assert lm.perplexity(["z", "z", "z"]) > lm.perplexity(["a", "c"])


def test_filter_pairs_counts_each_filter_and_keeps_the_rest(tmp_path, capsys):
    src = tmp_path / "pairs.tsv"
    rows = [
        "a cat sat on the mat\ta cat sat on the mat today",  # overlap 1: 6/6 -> dropped by overlap-1
        "the weather is nice\tit is sunny outside",  # kept
        "one two\tthis second side has far too many tokens in it to pass",  # length
        "birds fly south\tgeese migrate in winter",  # kept
    ]
    src.write_text("".join(r + "\n" for r in rows))
    out = tmp_path / "kept.tsv"
    stats = filters.filter_pairs(src, out, length=(0, 10), overlaps=[(1, 0.0, 0.7)])
    assert stats == {"read": 4, "length": 1, "overlap-1": 1, "kept": 2}
    assert out.read_text().splitlines() == [rows[1], rows[3]]
    lm_text = tmp_path / "ref.txt"
    lm_text.write_text("geese migrate in winter\nbirds fly in winter\n" * 3)
    stats = filters.filter_pairs(src, out, length=None, lm_text=lm_text, max_perplexity=20)
    assert stats["kept"] == 1 and out.read_text().splitlines() == [rows[3]]
    argv = ["filter-pairs", str(src), "--out", str(tmp_path / "cli.tsv"), "--overlap", "1", "--bleu", "0", "0.5"]
    assert steps.main(argv) == 0
    assert (tmp_path / "cli.tsv").read_text().splitlines() == [rows[1], rows[3]]


@pytest.mark.long
def test_filter_pairs_streams_in_bounded_memory(tmp_path):
    """Peak memory does not grow with the file: 20x more pairs cost less than 20 MiB more."""
    words = [f"w{i}" for i in range(500)]
    rng = random.Random(0)
    peaks = []
    for n in (10_000, 200_000):
        src = tmp_path / f"{n}.tsv"
        with open(src, "w") as f:
            for _ in range(n):
                f.write(" ".join(rng.choices(words, k=8)) + "\t" + " ".join(rng.choices(words, k=8)) + "\n")
        code = (
            "import resource, sys; from pathlib import Path; from paraphrastic.preprocess import filters; "
            "filters.filter_pairs(Path(sys.argv[1]), Path(sys.argv[2]), (0, 10), [(1, 0, 0.7)], (0, 1)); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
        )
        done = subprocess.run([sys.executable, "-c", code, src, tmp_path / "out.tsv"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        peaks.append(int(done.stdout.split()[-1]) / 1024)
    assert peaks[1] - peaks[0] < 20, peaks


def test_a_download_without_size_or_checksum_is_refused_unless_an_archive_test_can_vouch(tmp_path):
    """A server that sends no Content-Length cannot tell a cut-short file from a whole one."""
    import http.server
    import threading

    class NoLength(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()  # no Content-Length: the body ends when the connection closes
            self.wfile.write(b"x" * 1000)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NoLength)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/lid.176.bin"
        with pytest.raises(InputError, match="no size and there is no checksum"):
            download.fetch(url, tmp_path / "dl" / "lid.176.bin")
        assert not (tmp_path / "dl" / "lid.176.bin").exists()
        good = hashlib.sha256(b"x" * 1000).hexdigest()
        assert download.fetch(url, tmp_path / "dl" / "ok.bin", sha256=good).read_bytes() == b"x" * 1000
    finally:
        server.shutdown()


def test_opus_skips_a_corpus_the_server_does_not_have_and_stops_on_other_errors(tmp_path, monkeypatch, capsys):
    """HTTP 404 (download.NotFound) skips the corpus; any other HTTP error stops the download."""
    import http.server
    import threading

    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404 if "missing" in self.path else 500)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    corpus = next(iter(download.OPUS_CORPORA))
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        monkeypatch.setattr(download, "OPUS_URL", base + "/missing/{corpus}/{version}/{pair}.zip")
        download.opus("de", tmp_path, corpora=[corpus])
        err = capsys.readouterr().err
        assert corpus in err and "skipped" in err
        monkeypatch.setattr(download, "OPUS_URL", base + "/broken/{corpus}/{version}/{pair}.zip")
        with pytest.raises(InputError, match="HTTP 500"):
            download.opus("de", tmp_path, corpora=[corpus])
    finally:
        server.shutdown()


def test_numbers_a_step_cannot_use_are_usage_errors(capsys):
    """A bound that keeps nothing (nan, a range upside down) or a count below 1 is named before the step runs: the
    step would have kept no pair and said it was done (or, for --vocab-size 0, ended in sentencepiece's traceback)."""
    cases = [
        (["train-sp", "in.tsv", "--vocab-size", "0"], "argument --vocab-size: must be at least 8, got 0"),
        (["filter-paranmt", "in.tsv", "--sim-low", "nan", "--sim-high", "1", "--ovl", "0.5"],
         "argument --sim-low: expected a finite number, got 'nan'"),
        (["filter-paranmt", "in.tsv", "--sim-low", "0.9", "--sim-high", "0.5", "--ovl", "0.5"],
         "--sim-low/--sim-high: 0.9 is above 0.5, so nothing would pass"),
        (["filter-pairs", "in.tsv", "--length", "5", "2"], "--length: 5 is above 2, so nothing would pass"),
        (["filter-pairs", "in.tsv", "--bleu", "0.5", "0.2"], "--bleu: 0.5 is above 0.2, so nothing would pass"),
        (["filter-bitext", "root", "--lang", "de", "--workers", "0"], "argument --workers: must be at least 1, got 0"),
    ]  # fmt: skip
    for argv, named in cases:
        with pytest.raises(SystemExit) as stop:
            steps.parse_args([*argv, "--out", "out"])
        assert stop.value.code == 2 and named in capsys.readouterr().err
    assert steps.parse_args(["filter-pairs", "in.tsv", "--out", "out", "--length", "0", "10"]).length == [0, 10]
