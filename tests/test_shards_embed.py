"""Sharded embedding: N shards concatenated (or opened as one matrix) equal the unsharded output exactly,
and shards that do not belong together, or come out of order, are refused with an error naming the file."""

import json

import numpy as np
import pytest
from conftest import generated_sentences

from paraphrastic import embed_sentences
from paraphrastic.embed_sentences import concat_shards, open_sharded, shard_bounds


def embed(*args) -> int:
    return embed_sentences.main([*map(str, args), "--quiet"])


def write_lines(path, n: int, seed: int = 0):
    path.write_text("".join(s + "\n" for s in generated_sentences(n, seed=seed)))
    return path


def embed_shards(text, model, folder, num_shards: int, *extra) -> list:
    paths = [folder / f"part-{i}.npy" for i in range(num_shards)]
    for i, out in enumerate(paths):
        args = ["--sentence-file", text, "--load-file", model, "--output-file", out, "--chunk-lines", "17"]
        assert embed(*args, "--shard", i, "--num-shards", num_shards, *extra) == 0
    return paths


@pytest.mark.parametrize("lines", [0, 1, 2, 5, 99, 100, 101])
@pytest.mark.parametrize("num_shards", [1, 3, 7])
def test_shard_bounds_cut_the_lines_into_contiguous_near_equal_slices(lines, num_shards):
    bounds = [shard_bounds(lines, i, num_shards) for i in range(num_shards)]
    assert bounds[0][0] == 0 and bounds[-1][1] == lines
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("lines", [300, 301, 302, 2])  # divisible by 3, not divisible, fewer lines than shards
@pytest.mark.parametrize("dtype", ["float32", "float16", "ubinary"])
def test_three_shards_concatenated_equal_the_unsharded_output(lines, dtype, tiny_model_file, tmp_path):
    text = write_lines(tmp_path / "in.txt", lines)
    whole = tmp_path / "whole.npy"
    assert embed("--sentence-file", text, "--load-file", tiny_model_file, "--output-file", whole, "--dtype", dtype) == 0
    paths = embed_shards(text, tiny_model_file, tmp_path, 3, "--dtype", dtype)
    assert [len(np.load(p)) for p in paths] == [
        stop - start for start, stop in (shard_bounds(lines, i, 3) for i in range(3))
    ]
    assert embed("--concat", tmp_path / "joined.npy", *paths) == 0
    expected = np.load(whole)
    joined = np.load(tmp_path / "joined.npy")
    assert joined.dtype == expected.dtype and joined.shape == expected.shape == (lines, 2 if dtype == "ubinary" else 16)
    np.testing.assert_array_equal(joined, expected)
    matrix = open_sharded(paths)
    assert matrix.shape == expected.shape and len(matrix) == lines
    np.testing.assert_array_equal(np.asarray(matrix), expected)
    rows = np.random.default_rng(0).integers(0, lines, 50)
    np.testing.assert_array_equal(matrix[rows], expected[rows])  # rows from every shard, in any order
    np.testing.assert_array_equal(matrix[1:-1], expected[1:-1])
    np.testing.assert_array_equal(matrix[-1], expected[-1])
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_cut_unit_rows_in_shards_concatenate_and_only_with_their_kind(tiny_model_file, tmp_path, capsys):
    text = write_lines(tmp_path / "in.txt", 60)
    shape = ("--normalize", "--truncate-dim", 8)
    paths = embed_shards(text, tiny_model_file, tmp_path, 3, *shape)
    assert (
        embed("--sentence-file", text, "--load-file", tiny_model_file, "--output-file", tmp_path / "w.npy", *shape) == 0
    )
    assert embed("--concat", tmp_path / "joined.npy", *paths) == 0
    joined = np.load(tmp_path / "joined.npy")
    assert joined.shape == (60, 8) and np.allclose(np.linalg.norm(joined, axis=1), 1, atol=1e-6)
    np.testing.assert_array_equal(joined, np.load(tmp_path / "w.npy"))
    (tmp_path / "whole").mkdir()
    whole = embed_shards(text, tiny_model_file, tmp_path / "whole", 3, "--truncate-dim", 8)
    capsys.readouterr()
    assert_refused(
        capsys, [paths[0], whole[1], paths[2]], tmp_path / "x.npy", "does not match", "normalize False vs True"
    )
    with pytest.raises(SystemExit, match="2"):
        embed_sentences.main(["--concat", str(tmp_path / "x.npy"), *map(str, paths), "--normalize"])
    assert "--concat does not take --normalize" in capsys.readouterr().err


def test_more_shards_than_lines_gives_empty_shards_that_still_concatenate(tiny_model_file, tmp_path):
    text = write_lines(tmp_path / "in.txt", 2)
    paths = embed_shards(text, tiny_model_file, tmp_path, 5)
    assert [len(np.load(p)) for p in paths] == [0, 0, 1, 0, 1]
    assert concat_shards(paths, tmp_path / "all.npy") == 2
    assert embed("--sentence-file", text, "--load-file", tiny_model_file, "--output-file", tmp_path / "whole.npy") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "all.npy"), np.load(tmp_path / "whole.npy"))
    assert json.loads((tmp_path / "part-4.npy.json").read_text())["lines"] == 2


def test_a_shard_reports_bad_utf8_with_the_line_number_of_the_whole_file(tiny_model_file, tmp_path, capsys):
    lines = [s.encode() for s in generated_sentences(30)]
    lines[24] = b"broken \xff byte"
    (tmp_path / "in.txt").write_bytes(b"\n".join(lines) + b"\n")
    args = ["--sentence-file", tmp_path / "in.txt", "--load-file", tiny_model_file, "--output-file", tmp_path / "o.npy"]
    assert embed(*args, "--shard", 2, "--num-shards", 3, "--strict") == 2
    assert "in.txt:25: invalid UTF-8" in capsys.readouterr().err
    assert embed(*args, "--shard", 0, "--num-shards", 3, "--strict") == 0  # lines 1-10 are fine


def assert_refused(capsys, paths, out, *expected: str):
    assert embed_sentences.main(["--concat", str(out), *map(str, paths)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert all(text in err for text in expected), err
    assert not out.exists()


def test_concat_refuses_shards_out_of_order_missing_or_from_another_run(tiny_model_file, tmp_path, capsys):
    text = write_lines(tmp_path / "in.txt", 40)
    paths = embed_shards(text, tiny_model_file, tmp_path, 3)
    out = tmp_path / "all.npy"
    capsys.readouterr()
    assert_refused(capsys, [paths[1], paths[0], paths[2]], out, "part-1.npy: is shard 1 of 3", "in order")
    assert_refused(capsys, paths[:2], out, "2 shards given", "cut into 3")
    other = tmp_path / "other"
    other.mkdir()
    half = embed_shards(text, tiny_model_file, other, 3, "--dtype", "float16")
    capsys.readouterr()
    assert_refused(capsys, [paths[0], half[1], paths[2]], out, f"{half[1]}: does not match", "dtype")
    longer = write_lines(other / "in.txt", 41)
    alien = embed_shards(longer, tiny_model_file, other, 3)
    capsys.readouterr()
    assert_refused(capsys, [paths[0], paths[1], alien[2]], out, f"{alien[2]}: does not match", "lines")
    np.save(paths[2], np.zeros((5, 16), np.float32))  # rows replaced after the record was written
    assert_refused(capsys, paths, out, f"{paths[2]}: not the rows its record", "re-run that shard")
    (tmp_path / "part-2.npy.json").unlink()
    assert_refused(capsys, paths, out, "part-2.npy: no shard record")
    assert_refused(capsys, [tmp_path / "nope.npy"], out, "nope.npy: no such file")


@pytest.mark.parametrize(
    "args",
    [
        ["--shard", "3", "--num-shards", "3"],
        ["--shard", "-1", "--num-shards", "3"],
        ["--shard", "0"],
        ["--num-shards", "0", "--shard", "0"],
    ],
)
def test_bad_shard_arguments_are_usage_errors(args, tiny_model_file, tmp_path):
    text = write_lines(tmp_path / "in.txt", 3)
    with pytest.raises(SystemExit) as exit_:
        embed_sentences.main(["--sentence-file", str(text), "--output-file", str(tmp_path / "o.npy"), *args])
    assert exit_.value.code == 2 and not (tmp_path / "o.npy").exists()


def test_a_killed_rerun_of_a_shard_leaves_the_finished_one_whole(tiny_model_file, tmp_path, monkeypatch):
    text = write_lines(tmp_path / "in.txt", 40)
    paths = embed_shards(text, tiny_model_file, tmp_path, 2)
    want = np.concatenate([np.load(p) for p in paths])

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(embed_sentences, "embed_file", killed)
    args = ["--sentence-file", text, "--load-file", tiny_model_file, "--output-file", paths[1]]
    assert embed(*args, "--shard", 1, "--num-shards", 2) == 130
    assert concat_shards(paths, tmp_path / "all.npy") == 40
    np.testing.assert_array_equal(np.load(tmp_path / "all.npy"), want)
