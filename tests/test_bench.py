"""The benchmark suite's table and README formatting (no comparison systems needed)."""

import pytest

run = pytest.importorskip("run")


def test_ratio_formats_by_size():
    assert run.ratio(123_456, 100) == "1,235x"
    assert run.ratio(45, 3) == "15.0x"
    assert run.ratio(3, 4) == "0.75x"


def test_markdown_table():
    assert run.markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"


def test_replace_between_markers_keeps_the_rest():
    text = "top\n<!-- bench:start -->\nold\n<!-- bench:end -->\nbottom\n"
    out = run.replace_between(text, "new")
    assert out == "top\n<!-- bench:start -->\nnew\n<!-- bench:end -->\nbottom\n"
    with pytest.raises(SystemExit):
        run.replace_between("no markers", "new")
