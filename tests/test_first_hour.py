"""A new user's first hour: wrong choices that used to fail silently now say so, and messages name what to do."""

import gzip
import itertools
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import EVERY_EXTRA, ROOT, shared_data_or_skip

from paraphrastic import demo, embed_sentences, fileio, language, models, score_sentence_pairs, train, workers

SOURCES = {
    "en": ["train/en_text/enwiki_early_articles.txt.gz", "train/en_text/enwiki_2018_articles.txt.gz"],
    **{lang: [f"train/foreign_text/{lang}.txt.gz"] for lang in ("de", "fr", "es", "tr")},
}


def held_apart(lang: str, n: int = 4000) -> list[str]:
    """Lines of our training text that language.py's word lists never counted (every fifth line of the first
    200,000), for English from a second source as well."""
    root, out = shared_data_or_skip(), []
    for source in SOURCES[lang]:
        with gzip.open(root / source, "rt", encoding="utf-8") as f:
            lines = itertools.islice(f, 200_000)
            out += [line.strip() for i, line in enumerate(lines) if i % language.HELD_APART == 0][
                : n // len(SOURCES[lang])
            ]
    return out


def test_the_language_check_fires_on_latin_script_languages_and_stays_silent_on_english():
    english = held_apart("en")
    false_alarms = sum(lang not in ("en", "") for lang in language.guess(english)) / len(english)
    print(f"English lines guessed as another language: {false_alarms:.2%} of {len(english)}")
    assert false_alarms < 0.01
    for sample in (english[:500], english[500:1000]):
        stats: dict = {}
        language.tally(sample, stats, sample=len(sample))
        assert language.foreign_warning(stats) is None
    for lang, name in language.NAMES.items():
        stats = {}
        language.tally(held_apart(lang, 500), stats, sample=500)
        assert name in language.foreign_warning(stats) and "--load-file multilingual" in language.foreign_warning(stats)


def test_embed_warns_of_german_with_the_english_model_only(tmp_path, capsys):
    german = tmp_path / "de.txt"
    german.write_text("".join(line + "\n" for line in held_apart("de", 600)))
    args = ["--sentence-file", str(german), "--output-file", str(tmp_path / "v.npy"), "--quiet"]
    assert embed_sentences.main(args) == 0
    assert "look German: the shipped English model reads English only" in capsys.readouterr().err
    assert embed_sentences.main([*args, "--load-file", "multilingual"]) == 0
    assert "look German" not in capsys.readouterr().err


def test_more_threads_than_cores_get_a_word(capsys):
    cores = len(workers.os.sched_getaffinity(0))
    try:
        workers.use_threads(cores + 62)
    finally:
        workers.use_threads(None)
    assert f"--threads {cores + 62} on {cores} cores" in capsys.readouterr().err


def test_a_binary_file_is_refused_as_text(tmp_path, capsys):
    vectors = tmp_path / "v.npy"
    np.save(vectors, np.zeros((1000, 8), np.float32))
    assert embed_sentences.main(["--sentence-file", str(vectors), "--output-file", str(tmp_path / "o.npy")]) == 2
    assert f"error: {vectors}: a NumPy .npy, not UTF-8 text" in capsys.readouterr().err
    assert fileio.binary_kind(b"a\x00b\n\x00\n") is None  # a few NUL bytes in text are kept, as before


def test_compressed_random_or_other_encodings_are_refused_as_text(tmp_path, capsys):
    """A corpus packed as .xz or .zst, random bytes, or text in cp1251 used to be embedded as lines of U+FFFD, with
    a warning but rows that are not the text's: each is refused before any work, naming what it looks like (UTF-16
    text too, which was refused as "binary data"). Text with a few bad bytes (Latin-1 French, a short broken file)
    is still read, the bad bytes replaced and counted."""
    rng = np.random.default_rng(0)
    french = "Le chat dort sur le canapé près de la fenêtre, à côté du piano.\n" * 40
    cases = {
        "corpus.txt.xz": (b"\xfd7zXZ\x00" + rng.bytes(3000), "xz-compressed (unpack it"),
        "corpus.txt.zst": (b"\x28\xb5\x2f\xfd" + rng.bytes(3000), "zstd-compressed (unpack it"),
        "corpus.txt": (b"\x1f\x8b" + rng.bytes(3000), "gzip-compressed (named .gz"),
        "random.txt": (bytes(rng.integers(1, 256, 3000, dtype=np.uint8)), "undecodable bytes ("),
        "russian.txt": ("Привет, как дела? Это тест.\n".encode("cp1251") * 40, "undecodable bytes ("),
        "windows.txt": ("A line from PowerShell.\n".encode("utf-16") * 40, "UTF-16 text (as Windows tools"),
        "no-bom.txt": ("A line without a byte order mark.\n".encode("utf-16-be") * 40, "UTF-16 text ("),
        "french.txt": (french.encode("latin-1"), None),
        "short.txt": (b"ok\n\xff\xfe\n", None),
    }
    for name, (data, refused) in cases.items():
        (tmp_path / name).write_bytes(data)
        code = embed_sentences.main(["--sentence-file", str(tmp_path / name), "--output-file", str(tmp_path / "o.npy")])
        err = capsys.readouterr().err
        if refused:
            assert code == 2 and f"error: {tmp_path / name}: {refused}" in err, (name, err)
        else:
            assert code == 0 and "invalid UTF-8" in err, (name, err)


def test_training_folders_and_states_point_to_their_model(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"format": train.STATE_FORMAT, "step": 1}, run / "resume.pt")
    (run / "model.pt").write_bytes(b"")
    with pytest.raises(models.ModelError, match="a training folder, not a model: load .*model.pt"):
        models.load_model(run)
    with pytest.raises(models.ModelError, match="a training state for --resume, not a model: load model.pt"):
        models.load_model(run / "resume.pt")


def test_train_names_every_missing_argument_and_checks_the_device_first(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.parse_args([])
    assert "--train-file (or --train-shards) and --output-dir required" in capsys.readouterr().err
    bad = tmp_path / "bad.tsv"
    bad.write_text("no tab here\n")
    assert train.main(["--train-file", str(bad), "--output-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}:1:") and "training a sentencepiece model" not in err
    if not torch.cuda.is_available():
        assert train.main(["--train-file", str(bad), "--output-dir", str(tmp_path / "c"), "--device", "cuda"]) == 2
        assert not (tmp_path / "c").exists()


def test_an_sts_file_given_to_score_is_named_as_one_and_no_bar_precedes_an_error(tmp_path, capsys):
    sts = tmp_path / "sts.tsv"
    sts.write_text("4.2\tA man plays guitar.\tSomeone plays a guitar.\n")
    assert score_sentence_pairs.main(["--sentence-pair-file", str(sts)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "it looks like an STS file" in err


def test_the_demo_corpus_bar_reaches_the_end(tiny_model):
    seen = []
    demo.embed_corpus(
        tiny_model, "c", {i + 1: f"line {i}" for i in range(100)}, lambda done, desc="": seen.append(done)
    )
    assert seen[-1] == 1.0


def test_install_hints_are_quoted_and_module_help_names_the_command():
    assert fileio.install_hint("ray").startswith('pip install "paraphrastic[ray]"')
    done = subprocess.run([sys.executable, "-m", "paraphrastic.evaluate", "--help"], capture_output=True, text=True)
    assert done.stdout.startswith("usage: paraphrastic-evaluate")
    assert not [p for p in ROOT.glob("*.py") if "pip install .[" in p.read_text()]


def test_a_failed_download_names_the_local_option_and_downloads_has_help(tmp_path, monkeypatch, capsys):
    import urllib.error
    import urllib.request

    from paraphrastic.preprocess import download
    from paraphrastic.preprocess.evaluation import download as evaluation_download

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(fileio.InputError, match="pass it with --local"):
        download.fetch("https://example.org/x.zip", tmp_path / "x.zip")
    with pytest.raises(SystemExit):
        evaluation_download.main(["--help"])
    assert "folder the archives are downloaded into" in capsys.readouterr().out


def test_train_quiet_shows_no_bar(tmp_path, capsys):
    pairs = ROOT / "data" / "example-sentences-pairs.txt"
    args = ["--train-file", str(pairs), "--output-dir", str(tmp_path / "r"), "--max-steps", "2", "--vocab-size", "200"]
    assert train.main(args) == 0 and "step/s" in capsys.readouterr().err  # the bar, by default
    assert train.main([*args[:3], str(tmp_path / "q"), *args[4:], "--quiet"]) == 0
    assert "step/s" not in capsys.readouterr().err


def test_the_skip_summary_names_the_extras_ci_installs():
    """The last line of a run with skips names the install that makes them run: the one .ci/run makes."""
    installed = re.search(r'pip install -q (?:--no-compile )?-e "\.\[([\w,]+)\]"', (ROOT / ".ci" / "run").read_text())
    assert installed and installed.group(1) == EVERY_EXTRA
