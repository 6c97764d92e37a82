"""mine_bitext.py: the margin score against a hand computation, the retrieval rules, faiss (exact and IVF)
against exact torch search, the margin against cosine where neighbourhoods differ in density, planted pairs
recovered from generated text, paraphrase mode, one-line errors."""

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, generated_sentences, need

from paraphrastic import embed_sentences, knn, mine_bitext
from paraphrastic.mine_bitext import Side, margin, mine, nearest_keys, neighbourhood, one_to_one, parse_args
from paraphrastic.static import DEFAULT_MODEL


def needs_faiss():
    """faiss is an extra (`.[mine]`): skipped where absent, but CI must exercise it."""
    need("faiss")
    if not knn.have_faiss():
        if os.environ.get("CI") == "true":
            pytest.fail("faiss is missing: CI installs the mine extra")
        pytest.skip("faiss not installed")


def args_for(*extra: str):
    return parse_args(["--source", "s", "--target", "t", "--output-file", "o", "--quiet", *extra])


def side(vectors: np.ndarray, name: str = "x") -> Side:
    return Side(Path(name), np.asarray(vectors, dtype=np.float32), np.arange(len(vectors)))


def unit(*rows) -> np.ndarray:
    x = np.array(rows, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_margin_of_a_tiny_matrix_matches_the_hand_computation():
    src = unit([1, 0], [0.6, 0.8], [0, 1])
    tgt = unit([0.8, 0.6], [0, 1], [-1, 0.05])
    # cos(src, tgt) = [[.8, 0, -.9988], [.96, .8, -.5594], [.6, 1, .0499]]; k = 2 nearest of each sentence
    # x0: tgt 0 (.8), tgt 1 (0)      y0: src 1 (.96), src 0 (.8)
    # score(x0, y0) = .8 / ((.8 + 0) / 4 + (.96 + .8) / 4) = 1.25
    assert margin(np.array([0.8]), np.array([0.4]), np.array([0.88]))[0] == pytest.approx(1.25)
    # a neighbourhood whose mean cosine is near 0 is none: 0.1 / 0.0005 would be a margin of 200
    assert margin(np.array([0.1, 0.1]), np.array([0.0005, 0.05]), np.array([0.0005, 0.05])).tolist() == [-np.inf, 2]
    fwd = nearest_keys(side(tgt, "t"), side(src, "s"), 2, args_for())
    bwd = nearest_keys(side(src, "s"), side(tgt, "t"), 2, args_for())
    np.testing.assert_allclose(neighbourhood(fwd[0]), [0.4, (0.96 + 0.8) / 2, (1 + 0.6) / 2], atol=1e-6)
    y2 = np.array([0.05, -0.6 + 0.8 * 0.05]) / np.hypot(1, 0.05)  # cos(y2, x2), cos(y2, x1): its 2 nearest
    np.testing.assert_allclose(neighbourhood(bwd[0]), [0.88, (1 + 0.8) / 2, y2.mean()], atol=1e-6)
    src_rows, tgt_rows, scores = mine(side(src, "s"), side(tgt, "t"), args_for("--k", "2", "--retrieval", "forward"))
    got = dict(zip(src_rows.tolist(), zip(tgt_rows.tolist(), scores.tolist(), strict=True), strict=True))
    assert got[0] == (0, pytest.approx(1.25, abs=1e-5))
    assert got[1][0] == 0 and got[1][1] == pytest.approx(0.96 / ((0.96 + 0.8) / 4 + (0.96 + 0.8) / 4), abs=1e-5)
    assert got[2][0] == 1 and got[2][1] == pytest.approx(1.0 / ((1 + 0.6) / 4 + (1 + 0.8) / 4), abs=1e-5)


def brute_force_margin(src: np.ndarray, tgt: np.ndarray, k: int) -> np.ndarray:
    """Every pair's margin score from the paper's formula, with plain loops (the reference)."""
    cos = unit(*src) @ unit(*tgt).T
    out = np.empty_like(cos)
    for i in range(len(src)):
        for j in range(len(tgt)):
            near_x = sorted(cos[i], reverse=True)[:k]
            near_y = sorted(cos[:, j], reverse=True)[:k]
            out[i, j] = cos[i, j] / (sum(near_x) / (2 * k) + sum(near_y) / (2 * k))
    return out


@pytest.mark.parametrize("retrieval", ["forward", "intersect", "max-score"])
def test_retrieval_rules_against_brute_force(retrieval):
    rng = np.random.default_rng(1)
    src, tgt = rng.normal(size=(40, 8)) + 2, rng.normal(size=(30, 8)) + 2  # positive cosines: a defined margin
    k = 3
    ref = brute_force_margin(src, tgt, k)
    # each source's and target's best under the margin, among its own k nearest by cosine
    cos = unit(*src) @ unit(*tgt).T
    near_f = np.argsort(-cos, axis=1)[:, :k]
    near_b = np.argsort(-cos, axis=0)[:k].T
    fwd = np.array([near_f[i][np.argmax(ref[i, near_f[i]])] for i in range(len(src))])
    bwd = np.array([near_b[j][np.argmax(ref[near_b[j], j])] for j in range(len(tgt))])
    if retrieval == "forward":
        expected = {(i, int(fwd[i])) for i in range(len(src))}
    elif retrieval == "intersect":
        expected = {(i, int(fwd[i])) for i in range(len(src)) if bwd[fwd[i]] == i}
    else:
        candidates = sorted({(i, int(fwd[i])) for i in range(len(src))} | {(int(bwd[j]), j) for j in range(len(tgt))},
                            key=lambda p: -ref[p])  # fmt: skip
        used_s, used_t, expected = set(), set(), set()
        for s, t in candidates:
            if s not in used_s and t not in used_t:
                used_s.add(s), used_t.add(t), expected.add((s, t))
    s_rows, t_rows, scores = mine(side(src), side(tgt), args_for("--k", str(k), "--retrieval", retrieval))
    assert set(zip(s_rows.tolist(), t_rows.tolist(), strict=True)) == expected
    np.testing.assert_allclose(scores, ref[s_rows, t_rows], rtol=1e-5)
    assert np.all(np.diff(scores) <= 0)  # best first


def test_one_to_one_is_greedy_matching_in_score_order():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        src, tgt = rng.integers(0, 8, n), rng.integers(0, 8, n)
        score = rng.integers(0, 5, n).astype(float)  # many ties: the earlier candidate wins
        kept, used_s, used_t = [], set(), set()
        for i in sorted(range(n), key=lambda i: (-score[i], i)):
            if src[i] not in used_s and tgt[i] not in used_t:
                kept.append(i), used_s.add(src[i]), used_t.add(tgt[i])
        assert one_to_one(src, tgt, score).tolist() == sorted(kept)


@pytest.mark.parametrize("index", ["flat", "ivf"])
def test_faiss_search_equals_exact_torch_search(index, monkeypatch):
    needs_faiss()
    rng = np.random.default_rng(2)
    keys, queries = side(rng.normal(size=(500, 16)), "k"), side(rng.normal(size=(300, 16)), "q")
    # IVF visiting every list is exhaustive, so it must find the same neighbours as exact search
    lists = ["--nlist", "8", "--nprobe", "8"] if index == "ivf" else []
    args = args_for("--index", index, *lists, "--chunk-lines", "64")
    sims, ids = nearest_keys(keys, queries, 5, args)
    monkeypatch.setattr(knn, "have_faiss", lambda: False)
    ref_sims, ref_ids = nearest_keys(keys, queries, 5, args_for("--chunk-lines", "64"))
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(sims, ref_sims, atol=1e-5)


def test_auto_index_switches_to_ivf_past_the_threshold():
    needs_faiss()
    rng = np.random.default_rng(3)
    keys, queries = side(rng.normal(size=(1500, 16)), "k"), side(rng.normal(size=(300, 16)), "q")
    flat = nearest_keys(keys, queries, 4, args_for("--ivf-min", "1501"))[1]
    ivf = nearest_keys(keys, queries, 4, args_for("--ivf-min", "1500", "--nlist", "40", "--nprobe", "2"))[1]
    recall = np.mean([len(set(a) & set(b)) / 4 for a, b in zip(ivf, flat, strict=True)])
    assert 0.1 < recall < 0.9  # 2 of 40 lists visited: approximate, so IVF was used


def planted_files(folder: Path) -> set:
    """200 template sentences on both sides (punctuation changed) among 100 unpaired ones per side."""
    sentences = list(dict.fromkeys(s.lower().rstrip(".!") for s in generated_sentences(2000, seed=3)))
    rng = random.Random(0)
    rng.shuffle(sentences)
    paired = sentences[:200]
    src = [s + "!" for s in paired] + sentences[200:300]
    tgt = [s + "." for s in paired] + sentences[300:400]
    rng.shuffle(src), rng.shuffle(tgt)
    (folder / "src.txt").write_text("".join(s + "\n" for s in src))
    (folder / "tgt.txt").write_text("".join(s + "\n" for s in tgt))
    return {(s + "!", s + ".") for s in paired}


def mined(folder: Path, model: Path, *extra: str) -> list[list[str]]:
    args = ["--source", folder / "src.txt", "--target", folder / "tgt.txt", "--load-file", model]
    assert mine_bitext.main([*map(str, args), "--output-file", str(folder / "out.tsv"), "--quiet", *extra]) == 0
    return [line.split("\t") for line in (folder / "out.tsv").read_text().splitlines()]


def best_f1(rows: list[list[str]], gold: set) -> float:
    correct = np.array([(s, t) in gold for _, s, t in rows])
    hits = np.cumsum(correct)  # rows come best first
    return float(np.max(2 * hits / (np.arange(1, len(rows) + 1) + len(gold))))


@pytest.fixture
def blind_model_file(tiny_model, tmp_path) -> Path:
    """The tiny random model with zero rows for "!" and ".": a planted pair's two sides, which differ only there,
    get the same vector, so what mining must find follows from the method, not from a random table's luck."""
    sp = tiny_model.tokenizer.sp
    for piece in range(len(sp)):
        if sp.id_to_piece(piece).strip("\u2581") in ("!", "."):
            tiny_model.embedding.weight.data[piece] = 0
    path = tmp_path / "tiny.pt"
    tiny_model.save(path)
    return path


def test_mining_recovers_planted_pairs(blind_model_file, tmp_path):
    gold = planted_files(tmp_path)
    by_cosine = mined(tmp_path, blind_model_file, "--threshold=-inf", "--criterion", "cosine")
    # cosine 1 for every planted pair and below 1 for any other: they are exactly the 200 best rows
    assert {(s, t) for _, s, t in by_cosine[:200]} == gold and float(by_cosine[199][0]) > float(by_cosine[200][0])
    cut = mined(tmp_path, blind_model_file, "--threshold=-inf", "--criterion", "cosine", "--truncate-dim", "8")
    assert {(s, t) for _, s, t in cut[:200]} == gold  # a pair's vectors are one vector: so are their first 8 values
    assert [r[0] for r in cut[200:]] != [r[0] for r in by_cosine[200:]]  # the others' cosines are of 8 values now
    rows = mined(tmp_path, blind_model_file, "--threshold=-inf")
    assert all(len(r) == 3 for r in rows)
    scores = [float(r[0]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    assert len({s for _, s, t in rows}) == len(rows) == len({t for _, _, t in rows})  # max-score: one to one
    correct = [(s, t) in gold for _, s, t in rows]
    assert sum(correct) >= 0.95 * len(gold)  # by the margin: each side's nearest is its partner (measured 200)
    assert best_f1(rows, gold) > 0.9
    kept = mined(tmp_path, blind_model_file, "--threshold", "1.02")
    assert kept and all(float(r[0]) >= 1.02 for r in kept) and len(kept) < len(rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv", "src.txt", "tgt.txt", "tiny.pt"]  # no vectors left
    mined(tmp_path, blind_model_file, "--work-dir", str(tmp_path / "work"))
    assert list((tmp_path / "work").iterdir()) == []  # nor in --work-dir


def test_margin_beats_cosine_where_neighbourhoods_differ_in_density():
    """The margin's reason to be: 50 translation pairs in a sparse region (cosine about 0.8) and 50 unpaired
    sentences a side in a dense cluster (cosine about 0.9 with everything there). Cosine ranks the cluster's
    chance pairs first; the margin divides by each sentence's neighbourhood and ranks the true pairs first."""
    rng = np.random.default_rng(0)
    meaning = rng.normal(size=(50, 32))
    centre = rng.normal(size=32) * 3
    src = np.concatenate([meaning + 0.5 * rng.normal(size=(50, 32)), centre + 0.3 * rng.normal(size=(50, 32))])
    tgt = np.concatenate([meaning + 0.5 * rng.normal(size=(50, 32)), centre + 0.3 * rng.normal(size=(50, 32))])
    gold = {(i, i) for i in range(50)}
    f1 = {}
    for criterion in ["margin", "cosine"]:
        s_rows, t_rows, _ = mine(side(src), side(tgt), args_for("--criterion", criterion))
        f1[criterion] = best_f1([("", s, t) for s, t in zip(s_rows.tolist(), t_rows.tolist(), strict=True)], gold)
    assert f1["margin"] > 0.95 and f1["cosine"] < 0.85  # measured 1.0 and 0.79


def test_faiss_and_torch_give_the_same_mined_file(tiny_model_file, tmp_path, monkeypatch):
    needs_faiss()
    planted_files(tmp_path)
    with_faiss = mined(tmp_path, tiny_model_file, "--threshold=-inf", "--dtype", "float32")
    monkeypatch.setattr(knn, "have_faiss", lambda: False)
    without = mined(tmp_path, tiny_model_file, "--threshold=-inf", "--dtype", "float32")
    assert [r[1:] for r in with_faiss] == [r[1:] for r in without]
    np.testing.assert_allclose([float(r[0]) for r in with_faiss], [float(r[0]) for r in without], atol=2e-6)


def test_paraphrase_mode_skips_self_matches_duplicates_and_blank_lines(tiny_model_file, tmp_path):
    sentences = generated_sentences(300, seed=4)
    lines = sentences + sentences[:50] + ["", "   ", "tab\tinside"]
    random.Random(1).shuffle(lines)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "para.tsv"
    args = ["--paraphrase", tmp_path / "in.txt", "--load-file", tiny_model_file, "--output-file", out]
    assert mine_bitext.main([*map(str, args), "--threshold=-inf", "--quiet"]) == 0
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert rows and all(len(r) == 3 for r in rows)
    assert all(a != b and a.strip() and b.strip() for _, a, b in rows)
    assert len({frozenset((a, b)) for _, a, b in rows}) == len(rows)  # each unordered pair once
    assert {a for _, a, _ in rows} | {b for _, _, b in rows} <= set(lines) | {"tab inside"}
    distinct = len(set(lines) - {"", "   "})
    assert distinct / 2 <= len(rows) <= distinct  # every sentence's best neighbour, pairs counted once


def test_line_numbers_name_each_pair_and_saved_vectors_mine_the_same_pairs(tiny_model_file, tmp_path, monkeypatch):
    """--line-numbers writes both 1-based line numbers (a repeated line is told apart by them); --vectors reads the
    file's vectors as paraphrastic-embed wrote them and mines what embedding again mines, without embedding."""
    lines = generated_sentences(200, seed=5)
    lines[7] = lines[3]  # a repeat: mined once, under its first line
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    base = ["--paraphrase", tmp_path / "in.txt", "--load-file", tiny_model_file, "--threshold=-inf", "--quiet"]
    base += ["--dtype", "float32"]  # as paraphrastic-embed writes them
    assert mine_bitext.main([*map(str, base), "--output-file", str(tmp_path / "plain.tsv")]) == 0
    assert mine_bitext.main([*map(str, base), "--output-file", str(tmp_path / "n.tsv"), "--line-numbers"]) == 0
    numbered = [line.split("\t") for line in (tmp_path / "n.tsv").read_text().splitlines()]
    plain = [line.split("\t") for line in (tmp_path / "plain.tsv").read_text().splitlines()]
    assert [[r[0], r[3], r[4]] for r in numbered] == plain
    assert all(lines[int(a) - 1] == s and lines[int(b) - 1] == t for _, a, b, s, t in numbered)
    assert "8" not in {n for r in numbered for n in r[1:3]}  # line 8 repeats line 4
    vectors = tmp_path / "v.npy"
    assert embed_sentences.main(["--sentence-file", str(tmp_path / "in.txt"), "--output-file", str(vectors),
                                 "--load-file", str(tiny_model_file), "--quiet"]) == 0  # fmt: skip
    monkeypatch.setattr(mine_bitext, "embed_file", None)  # no embedding: a call would fail
    given = [*map(str, base), "--output-file", str(tmp_path / "v.tsv"), "--line-numbers", "--vectors", str(vectors)]
    assert mine_bitext.main(given) == 0
    again = [line.split("\t") for line in (tmp_path / "v.tsv").read_text().splitlines()]
    assert again == numbered
    np.save(tmp_path / "short.npy", np.load(vectors)[:10])
    short = run_mine(*base, "--output-file", tmp_path / "x.tsv", "--vectors", tmp_path / "short.npy")
    assert short.returncode == 2 and "short.npy: float32 rows of shape (10, 16), where" in short.stderr


def test_without_faiss_a_large_input_is_refused_before_it_is_embedded(tiny_model_file, tmp_path, monkeypatch, capsys):
    (tmp_path / "in.txt").write_text("\n".join(generated_sentences(300, seed=6)) + "\n")
    monkeypatch.setattr(knn, "have_faiss", lambda: False)
    monkeypatch.setattr(mine_bitext, "embed_file", None)  # embedding first would fail another way
    args = ["--paraphrase", tmp_path / "in.txt", "--load-file", tiny_model_file, "--output-file", tmp_path / "o.tsv"]
    assert mine_bitext.main([*map(str, args), "--ivf-min", "100", "--quiet"]) == 2
    assert "faiss is needed to search 292 sentences with an IVF index: pip install" in capsys.readouterr().err


def test_a_file_with_one_usable_line_or_none_mines_nothing(tiny_model_file, tmp_path):
    (tmp_path / "one.txt").write_text("only one sentence\n\n")
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "out.tsv"
    for args in (["--paraphrase", "one.txt"], ["--source", "empty.txt", "--target", "one.txt"]):
        args = [str(tmp_path / a) if a.endswith(".txt") else a for a in args]
        assert mine_bitext.main([*args, "--load-file", str(tiny_model_file), "--output-file", str(out), "--quiet"]) == 0
        assert out.read_text() == ""


def run_mine(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "mine_bitext.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_errors_are_one_line_and_name_the_file(tiny_model_file, tmp_path, monkeypatch, capsys):
    (tmp_path / "ok.txt").write_text("a sentence\n")
    (tmp_path / "bad.txt").write_bytes(b"fine\nbroken \xff\n")
    model = ["--load-file", tiny_model_file, "--output-file", tmp_path / "o.tsv"]
    missing = run_mine("--source", tmp_path / "ok.txt", "--target", tmp_path / "nope.txt", *model)
    strict = run_mine("--source", tmp_path / "bad.txt", "--target", tmp_path / "ok.txt", *model, "--strict")
    for done, expected in ((missing, "nope.txt: no such file"), (strict, "bad.txt:2: invalid UTF-8")):
        assert done.returncode == 2 and done.stderr.startswith("error: ") and expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    wide = run_mine("--paraphrase", tmp_path / "ok.txt", *model, "--truncate-dim", "17")
    assert wide.returncode == 2 and wide.stderr == "error: --truncate-dim 17 is more than the model's 16 values a row\n"
    monkeypatch.setattr(knn, "have_faiss", lambda: False)
    args = ["--source", tmp_path / "ok.txt", "--target", tmp_path / "ok.txt", *model, "--index", "ivf", "--quiet"]
    assert mine_bitext.main(list(map(str, args))) == 2
    assert "pip install faiss-cpu" in capsys.readouterr().err
    assert not (tmp_path / "o.tsv").exists()
    for bad in (["--source", "a"], ["--paraphrase", "a", "--source", "b", "--target", "c"], ["--target", "a"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args([*bad, "--output-file", "o"])
        assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:  # an IVF option beside an exact search: named, not ignored
        parse_args(["--paraphrase", "a", "--output-file", "o", "--index", "flat", "--nlist", "8", "--seed", "3"])
    assert exit_.value.code == 2 and "error: --index flat does not take --nlist, --seed (" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # no score is at least nan: a run that writes nothing, refused
        parse_args(["--paraphrase", "a", "--output-file", "o", "--threshold", "nan"])
    assert exit_.value.code == 2 and "error: --threshold nan keeps no pair" in capsys.readouterr().err
    assert parse_args(["--paraphrase", "a", "--output-file", "o", "--threshold=-inf"]).threshold == -math.inf


def test_real_english_sentences_are_found_again_after_a_shuffle(shared_data, tmp_path):
    english = (shared_data / "tatoeba" / "fra-eng.eng").read_text(encoding="utf-8").splitlines()[:500]
    changed = [s.rstrip(".!?") for s in english]  # the same sentence without its final punctuation
    order = list(range(len(english)))
    random.Random(0).shuffle(order)
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in english), encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("".join(changed[i] + "\n" for i in order), encoding="utf-8")
    rows = mined(tmp_path, DEFAULT_MODEL)  # the shipped English model, default threshold
    gold = set(zip(english, changed, strict=True))
    assert sum((s, t) in gold for _, s, t in rows) >= 0.97 * len(set(english))
