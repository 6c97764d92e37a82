"""The embed and score scripts: outputs match the API, one row per input line, clear one-line errors."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, generated_sentences, need

from paraphrastic import embed_sentences, precision, score_sentence_pairs, static, train
from paraphrastic.models import load_model


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_embed_cli_matches_api(tiny_model_file, tmp_path):
    sentences = generated_sentences(200, seed=7)
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    out = tmp_path / "out.npy"
    args = ["--sentence-file", tmp_path / "in.txt", "--load-file", tiny_model_file, "--output-file", out]
    assert embed_sentences.main([*map(str, args), "--chunk-lines", "37", "--batch-size", "16", "--quiet"]) == 0
    got = np.load(out)
    assert got.shape == (200, 16) and got.dtype == np.float32
    np.testing.assert_array_equal(got, load_model(tiny_model_file).embed_raw_text(sentences))
    assert embed_sentences.main([*map(str, args), "--dtype", "float16", "--quiet"]) == 0
    assert np.load(out).dtype == np.float16
    for dtype in ("binary", "ubinary"):  # each row's signs, 8 a byte, as encode's precision gives them
        assert embed_sentences.main([*map(str, args), "--chunk-lines", "37", "--dtype", dtype, "--quiet"]) == 0
        np.testing.assert_array_equal(np.load(out), load_model(tiny_model_file).encode(sentences, precision=dtype))
    for dtype in ("float16", "ubinary"):  # cut, then unit length, then stored, as encode makes them
        extra = ["--chunk-lines", "37", "--dtype", dtype, "--normalize", "--truncate-dim", "12", "--quiet"]
        assert embed_sentences.main([*map(str, args), *extra]) == 0
        rows = load_model(tiny_model_file).encode(sentences, normalize_embeddings=True, truncate_dim=12)
        want = rows.astype(np.float16) if dtype == "float16" else precision.signs(rows)
        assert np.load(out).shape == (200, 12 if dtype == "float16" else 2)
        np.testing.assert_array_equal(np.load(out), want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.npy", "tiny.pt"]
    too_wide = run_script("embed_sentences.py", *args, "--truncate-dim", "17")
    assert (
        too_wide.returncode == 2
        and too_wide.stderr == "error: --truncate-dim 17 is more than the model's 16 values a row\n"
    )


def test_embed_keeps_one_row_per_line_on_messy_text(tiny_model_file, tmp_path):
    raw = b"first line\r\n\r\n\xff\xfe broken bytes\nnul\x00byte\n" + b"long " * 200_000 + b"\nno final newline"
    (tmp_path / "messy.txt").write_bytes(raw)
    out = tmp_path / "messy.npy"
    args = ["--sentence-file", tmp_path / "messy.txt", "--load-file", tiny_model_file, "--output-file", out]
    assert embed_sentences.main([*map(str, args), "--quiet"]) == 0
    got = np.load(out)
    assert got.shape[0] == 6
    model = load_model(tiny_model_file)
    expect = model.embed_raw_text(["first line", "", "\ufffd\ufffd broken bytes", "nul\x00byte"])
    np.testing.assert_array_equal(got[:4], expect)
    strict = run_script("embed_sentences.py", *args, "--strict", "--quiet")
    assert strict.returncode == 2
    assert strict.stderr.strip() == strict.stderr.strip().splitlines()[0]
    assert "messy.txt:3: invalid UTF-8" in strict.stderr


def test_empty_input_gives_empty_matrix(tiny_model_file, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    out = tmp_path / "e.npy"
    args = ["--sentence-file", tmp_path / "empty.txt", "--load-file", tiny_model_file, "--output-file", out]
    assert embed_sentences.main([*map(str, args), "--quiet"]) == 0
    assert np.load(out).shape == (0, 16)


def test_a_reader_that_stops_reading_ends_the_command_quietly_with_its_workers(tiny_model_file, tmp_path):
    """`paraphrastic-score ... | head -1`: once the reader is gone the command stops as Unix tools do, exit 141
    (SIGPIPE's) and nothing said, its workers with it; it used to say `error: Broken pipe` and exit 2."""
    pairs = tmp_path / "many-pairs.txt"
    sides = zip(generated_sentences(30_000, 1), generated_sentences(30_000, 2), strict=True)
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in sides))
    command = [sys.executable, "-m", "paraphrastic.score_sentence_pairs", "--sentence-pair-file", str(pairs)]
    run = subprocess.Popen([*command, "--load-file", str(tiny_model_file), "--threads", "2", "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    first = run.stdout.readline()
    run.stdout.close()
    err, code = run.stderr.read(), run.wait(timeout=120)
    assert first.count(b"\t") == 2 and (code, err) == (141, b"")
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(pairs).encode() in read_or_empty(p)]
    assert not left  # no worker outlives it


def test_score_and_embed_read_a_pipe_as_it_comes(tiny_model_file, tmp_path):
    """`generate | paraphrastic-score --sentence-pair-file -` (and embed's `--sentence-file -`): the rows of the same
    lines in a file, bit for bit, through the workers; a bad line is named by its number on standard input; a shard
    needs a file."""
    sides = zip(generated_sentences(3000, 3), generated_sentences(3000, 4), strict=True)
    text = "".join(f"{a}\t{b}\n" for a, b in sides)
    (tmp_path / "pairs.txt").write_text(text)
    score = [sys.executable, "-m", "paraphrastic.score_sentence_pairs", "--load-file", str(tiny_model_file), "--quiet"]
    piped = subprocess.run([*score, "--sentence-pair-file", "-", "--chunk-lines", "500"], input=text.encode(),
                           capture_output=True, check=True)  # fmt: skip
    from_file = subprocess.run([*score, "--sentence-pair-file", str(tmp_path / "pairs.txt")], capture_output=True)
    assert piped.stdout == from_file.stdout and piped.stdout.count(b"\n") == 3000
    bad = subprocess.run([*score, "--sentence-pair-file", "-"], input=b"a\tb\nno tab\n", capture_output=True)
    assert bad.returncode == 2 and bad.stderr.decode().startswith("error: /dev/stdin:2: expected sentence1<TAB>")
    embed = [sys.executable, "-m", "paraphrastic.embed_sentences", "--load-file", str(tiny_model_file), "--quiet"]
    for dtype in ("float32", "ubinary"):
        out = tmp_path / f"piped-{dtype}.npy"
        subprocess.run([*embed, "--sentence-file", "-", "--output-file", str(out), "--chunk-lines", "700", "--dtype",
                        dtype, "--threads", "2"], input=text.encode(), capture_output=True, check=True)  # fmt: skip
        args = ["--sentence-file", tmp_path / "pairs.txt", "--load-file", tiny_model_file, "--dtype", dtype]
        assert embed_sentences.main([*map(str, args), "--output-file", str(tmp_path / "file.npy"), "--quiet"]) == 0
        assert np.load(out).tobytes() == np.load(tmp_path / "file.npy").tobytes() and len(np.load(out)) == 3000
    shard = run_script("embed_sentences.py", "--sentence-file", "-", "--output-file", str(tmp_path / "v.npy"),
                       "--shard", "0", "--num-shards", "2")  # fmt: skip
    assert shard.returncode == 2 and "--shard needs a file, not standard input" in shard.stderr


def read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process that ended meanwhile
        return b""


def test_score_cli_matches_api(tiny_model_file, tmp_path):
    pairs = list(zip(generated_sentences(120, 8), generated_sentences(120, 9), strict=True))
    (tmp_path / "pairs.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    out = tmp_path / "scores.txt"
    args = ["--sentence-pair-file", tmp_path / "pairs.txt", "--load-file", tiny_model_file, "--output-file", out]
    assert score_sentence_pairs.main([*map(str, args), "--chunk-lines", "50", "--quiet"]) == 0
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert [(a, b) for a, b, _ in rows] == pairs
    expect = load_model(tiny_model_file).score_raw_text(pairs)
    np.testing.assert_allclose([float(s) for _, _, s in rows], expect, atol=1e-6)


def test_score_to_stdout(tiny_model_file, tmp_path):
    (tmp_path / "p.txt").write_text("a man\ta woman\nthe dog\tthe dog\n")
    done = run_script("score_sentence_pairs.py", "--sentence-pair-file", tmp_path / "p.txt", "--load-file",
                      tiny_model_file, "--quiet")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith("the dog\tthe dog\t") and float(lines[1].split("\t")[2]) == 1.0


@pytest.mark.parametrize("bad_line", ["no tab at all", "one\ttwo\tthree"])
def test_malformed_pair_line_is_a_one_line_error(tiny_model_file, tmp_path, bad_line):
    (tmp_path / "p.txt").write_text(f"a\tb\nc\td\n{bad_line}\ne\tf\n")
    out = tmp_path / "o.txt"
    base = ["--sentence-pair-file", tmp_path / "p.txt", "--load-file", tiny_model_file, "--output-file", out]
    done = run_script("score_sentence_pairs.py", *base, "--quiet")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "p.txt:3: expected sentence1<TAB>sentence2" in done.stderr
    assert not out.exists(), "a failed run leaves no output"
    skipped = run_script("score_sentence_pairs.py", *base, "--skip-bad-lines", "--quiet")
    assert skipped.returncode == 0 and "1 bad lines (not exactly one tab) scored nan: line 3" in skipped.stderr
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert [r[:2] for r in rows] == [["a", "b"], ["c", "d"], [bad_line.replace("\t", " "), ""], ["e", "f"]]
    assert [r[2] == "nan" for r in rows] == [False, False, True, False], "row i is line i; the bad line scores nan"


def test_missing_files_are_one_line_errors(tiny_model_file, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    cases = [
        ("embed_sentences.py", "--sentence-file", tmp_path / "in.txt", "--load-file", tmp_path / "nope.pt"),
        ("embed_sentences.py", "--sentence-file", tmp_path / "nope.txt", "--load-file", tiny_model_file),
        ("score_sentence_pairs.py", "--sentence-pair-file", tmp_path / "nope.txt", "--load-file", tiny_model_file),
    ]
    for script, *args in cases:
        extra = ["--output-file", tmp_path / "o.npy"] if script == "embed_sentences.py" else []
        done = run_script(script, *args, *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        assert "nope" in done.stderr and "Traceback" not in done.stderr


def test_a_pair_with_an_empty_side_scores_nan_not_one(tiny_model_file, tmp_path):
    model = load_model(tiny_model_file)
    scores = model.score_raw_text([("", ""), ("a man", "  "), ("a man", "a man")])
    assert np.isnan(scores[0]) and np.isnan(scores[1]) and scores[2] == pytest.approx(1.0)
    (tmp_path / "p.txt").write_text("\t\na man\ta man\n")
    done = run_script(
        "score_sentence_pairs.py", "--sentence-pair-file", tmp_path / "p.txt", "--load-file", tiny_model_file
    )
    assert done.returncode == 0 and "1 pairs with an empty side scored nan" in done.stderr
    assert [line.split("\t")[2] for line in done.stdout.splitlines()] == ["nan", "1.000000"]


def test_one_pair_as_a_tuple_is_a_clear_error(tiny_model_file):
    model = load_model(tiny_model_file)
    with pytest.raises(TypeError, match="pass \\[\\(a, b\\)\\]"):
        model.score_raw_text(("a man", "a dog"))
    with pytest.raises(TypeError, match="each two strings"):
        model.score_raw_text(["a man", "a dog"])


def test_encode_and_similarity_are_the_sentence_transformers_names(tiny_model_file):
    model = load_model(tiny_model_file)
    sentences = generated_sentences(5, seed=3)
    np.testing.assert_array_equal(model.encode(sentences), model.embed_raw_text(sentences))
    matrix = model.similarity(sentences[:2], model.encode(sentences))
    assert matrix.shape == (2, 5)
    pairs = [(a, b) for a in sentences[:2] for b in sentences]
    np.testing.assert_allclose(matrix.ravel(), model.score_raw_text(pairs), atol=1e-5)
    pairwise = model.similarity_pairwise(sentences[:3], model.encode(sentences[2:]))
    np.testing.assert_allclose(
        pairwise, model.score_raw_text(list(zip(sentences[:3], sentences[2:], strict=True))), atol=1e-5
    )
    with pytest.raises(ValueError, match="of one shape"):
        model.similarity_pairwise(sentences[:2], sentences)
    assert model.get_sentence_embedding_dimension() == model.dim == 16
    for side in (model.encode_query, model.encode_document):
        np.testing.assert_array_equal(
            side(sentences, normalize_embeddings=True), model.encode(sentences, normalize_embeddings=True)
        )


def test_idle_cores_set_the_default_thread_count(monkeypatch):
    import torch

    from paraphrastic import workers
    from paraphrastic.workers import use_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
        monkeypatch.setattr(workers, "running_tasks", lambda: 3)
        monkeypatch.setattr("os.getloadavg", lambda: (2.6, 0.0, 0.0))
        assert use_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.setattr("os.getloadavg", lambda: (9.0, 0.0, 0.0))
        assert use_threads() == 1
        monkeypatch.setattr("os.getloadavg", lambda: (0.2, 0.0, 0.0))
        assert use_threads() == 4
        assert use_threads(3) == 3
        monkeypatch.setattr("os.getloadavg", lambda: (1.9, 0.0, 0.0))  # a job that has just ended
        monkeypatch.setattr(workers, "running_tasks", lambda: 0)
        assert use_threads() == 4
        monkeypatch.setattr(workers, "running_tasks", lambda: None)  # no /proc: the average alone
        assert use_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "script, args",
    [
        ("embed_sentences.py", ["--sentence-file", "x", "--output-file", "y.npy", "--batch-size", "-1"]),
        ("embed_sentences.py", ["--sentence-file", "x", "--output-file", "y.npy", "--chunk-lines", "0"]),
        ("score_sentence_pairs.py", ["--sentence-pair-file", "x", "--threads", "-1"]),
        ("train.py", ["--train-file", "x", "--output-dir", "y", "--max-steps", "0"]),
    ],
)
def test_bad_numbers_are_usage_errors(script, args):
    done = run_script(script, *args)
    assert done.returncode == 2 and "must be at least" in done.stderr and "Traceback" not in done.stderr


def test_concat_refuses_the_options_it_would_ignore(tmp_path, capsys):
    """--concat joins the shards as they are: an embedding option beside it is a usage error naming it (--dtype
    float16 used to give float32 rows without a word)."""
    for args, named in [(["--dtype", "float16", "--load-file", "multilingual"], "--load-file, --dtype"),
                        (["--sentence-file", "x.txt"], "--sentence-file")]:  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            embed_sentences.main(["--concat", str(tmp_path / "all.npy"), str(tmp_path / "a.npy"), *args])
        assert stop.value.code == 2 and f"error: --concat does not take {named} (" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_output_in_a_folder_not_yet_made_is_written(tiny_model_file, tmp_path):
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    out = tmp_path / "vectors" / "part-0.npy"  # a job array's first shard, before anyone made vectors/
    args = ["--sentence-file", tmp_path / "in.txt", "--load-file", tiny_model_file, "--output-file", out, "--quiet"]
    assert embed_sentences.main(list(map(str, args))) == 0
    assert np.load(out).shape == (2, 16)


def test_evaluation_data_is_looked_for_where_the_download_puts_it(tmp_path, monkeypatch):
    from paraphrastic import options

    monkeypatch.setenv("PARAPHRASTIC_DATA", str(tmp_path / "mine"))
    assert options.default_data_dir() == tmp_path / "mine"
    monkeypatch.delenv("PARAPHRASTIC_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(options, "__file__", str(tmp_path / "site-packages" / "paraphrastic" / "options.py"))
    assert options.default_data_dir() == tmp_path / "cache" / "paraphrastic" / "data"  # an installed copy
    done = run_script("evaluate.py", "--help")
    assert "PARAPHRASTIC_DATA" in done.stdout


def test_the_english_model_says_once_that_other_languages_need_the_multilingual_one(tmp_path, capsys):
    from paraphrastic import mine_bitext

    (tmp_path / "de.txt").write_text("Ein Mann spielt Gitarre.\nDie Kinder schwimmen.\n")
    (tmp_path / "en.txt").write_text("The children swim.\nA man plays guitar.\n")
    args = ["--source", tmp_path / "de.txt", "--target", tmp_path / "en.txt", "--output-file", tmp_path / "m.tsv"]
    assert mine_bitext.main([*map(str, args), "--quiet", "--threshold=-inf"]) == 0
    assert capsys.readouterr().err.count("use --load-file multilingual") == 1


def test_the_unknown_text_warning_fits_the_model(sp_bytes):
    import torch

    from paraphrastic import encoders, models

    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    english = models.SPModel(tokenizer, torch.zeros(len(tokenizer), 4))
    stats = {"mostly_unknown": 3, "unknown_checked": 10}
    assert "use --load-file multilingual" in static.unknown_warning(english, stats)
    assert "1.0% of the sentences checked" in static.unknown_warning(
        english, {"mostly_unknown": 10, "unknown_checked": 1000}
    )
    assert static.unknown_warning(english, {"mostly_unknown": 9, "unknown_checked": 1000}) is None  # a stray line
    words = encoders.WordTokenizer(["<unk>", "a", "man"], lowercase=True)
    word_model = models.Model([words], ["mean"], torch.zeros(len(words), 4))
    note = static.unknown_warning(word_model, stats)
    assert "multilingual" not in note and "--max-types" in note


def test_an_output_folder_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    """The file is named in one line (mkdir's own "File exists" read as if a folder were in the way) and kept."""
    taken = tmp_path / "taken"
    taken.write_text("mine\n")
    (tmp_path / "pairs.tsv").write_text("a man\ta guy\nthe dog\tthe cat\n")
    assert train.main(["--train-file", str(tmp_path / "pairs.tsv"), "--output-dir", str(taken)]) == 2
    assert capsys.readouterr().err == f"error: {taken}: is a file; --output-dir takes a folder\n"
    assert taken.read_text() == "mine\n"


def options_given(text: str) -> dict[str, set[str]]:
    """The --options each console command (paraphrastic-X, or train.py) is given in shell text, line by line."""
    given: dict[str, set[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        for name, rest in re.findall(r"(paraphrastic-\w+|\btrain\.py)\b([^|;&>`]*)", line):
            given.setdefault(name, set()).update(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest))
    return given


def test_the_recipes_and_docs_pass_only_options_their_commands_have(capsys):
    """Every --option that the shell scripts, and the README's and docs' commands (code blocks and spans), give a
    console command is one that command's --help names: an option renamed in a command and not in a recipe fails
    here, not an hour into a training run."""
    entry = re.findall(r'"(paraphrastic-\w+) = ([\w.]+):(\w+)"', (ROOT / "setup.py").read_text())
    modules = {name: (module, function) for name, module, function in entry}
    modules["train.py"] = ("paraphrastic.train", "main")
    texts = [p.read_text() for p in [*(ROOT / "scripts").glob("*.sh"), *(ROOT / "preprocess").rglob("*.sh")]]
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        texts += re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S) + re.findall(r"`([^`\n]+)`", doc.read_text())
    given: dict[str, set[str]] = {}
    for found in map(options_given, texts):
        for name, options in found.items():
            if name in modules:  # not a format's name ("paraphrastic-sp")
                given.setdefault(name, set()).update(options)
    assert {"paraphrastic-train", "paraphrastic-evaluate", "paraphrastic-mine", "train.py"} <= given.keys()
    unknown = []
    for name, options in sorted(given.items()):
        with pytest.raises(SystemExit):
            module, function = modules[name]
            getattr(importlib.import_module(module), function)(["--help"])
        known = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", capsys.readouterr().out))
        unknown += [f"{name} {option}" for option in sorted(options - known)]
    assert unknown == []


def python_examples(doc: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)


@pytest.mark.long
def test_the_readme_and_docs_python_examples_run(tmp_path):
    """The README's Python example, and docs/usage.md's for sentence-transformers and model2vec (on a folder the
    export command writes first, as the docs say) and for the LangChain, LlamaIndex and Chroma adapters, run as
    written."""
    (readme,) = python_examples(ROOT / "README.md")
    subprocess.run([sys.executable, "-c", readme], cwd=tmp_path, check=True, capture_output=True, timeout=120)
    other, adapters = python_examples(ROOT / "docs" / "usage.md")
    for module in ("sentence_transformers", "model2vec", "langchain_core", "llama_index.core", "chromadb"):
        need(module)
    export = [sys.executable, "-m", "paraphrastic.interop", "--output-dir", "my-model"]
    subprocess.run(export, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    for example in (other, adapters):
        subprocess.run([sys.executable, "-c", example], cwd=tmp_path, check=True, capture_output=True, timeout=120)


def test_center_model_weights_each_row_by_its_pieces_share_after_whitening(tiny_model_file, tmp_path, monkeypatch):
    """scripts/center_model.py --sif-a A: the model it writes without the option, each row then scaled by
    A / (A + p(piece)), p the piece's share of the sentences file (frequent pieces count less)."""
    import center_model
    import torch

    from paraphrastic.teacher import piece_probabilities

    sentences, dev = tmp_path / "sentences.txt", tmp_path / "dev.tsv"
    sentences.write_text("".join(s + "\n" for s in generated_sentences(200, seed=5)), encoding="utf-8")
    a, b = generated_sentences(40, seed=6), generated_sentences(40, seed=7)
    dev.write_text("".join(f"{k % 6}\t{x}\t{y}\n" for k, (x, y) in enumerate(zip(a, b, strict=True))), encoding="utf-8")
    for name, extra in (("plain.pt", []), ("sif.pt", ["--sif-a", "0.01"])):
        argv = [str(tiny_model_file), str(sentences), str(tmp_path / name), "--dev-file", str(dev), "--powers", "0.2"]
        monkeypatch.setattr(sys, "argv", ["center_model.py", *argv, "--precision", "float32", *extra])
        center_model.main()
    plain, sif = load_model(tmp_path / "plain.pt"), load_model(tmp_path / "sif.pt")
    p = torch.from_numpy(piece_probabilities(plain.tokenizer, sentences)).float()
    assert p.max() > 0.01  # some pieces are frequent enough to be weighted down by half or more
    torch.testing.assert_close(sif.embedding.weight, plain.embedding.weight * (0.01 / (0.01 + p))[:, None])
    assert sif.config["sif_after_training"] == 0.01 and "sif_after_training" not in plain.config
    assert sif.config["whitening"] == plain.config["whitening"] == 0.2
