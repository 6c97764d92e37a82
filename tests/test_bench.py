"""The benchmark suite's table and README formatting (no comparison systems needed), and the device check's dry
run."""

import gzip
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, need

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


@pytest.mark.long
def test_the_device_check_runs_whole_on_the_cpu(shared_data, tmp_path):
    """bench_gpu.py --dry-run: every part of the one call on a lent GPU machine, small and on the CPU, so that its
    few minutes never meet a broken script; every figure it prints is there, and no part failed. Its data folder is
    a small one of the layout `--pack` writes."""
    need("transformers")  # the teacher's part
    data = tmp_path / "data"
    (data / "sts" / "en").mkdir(parents=True)
    shutil.copytree(shared_data / "sts" / "en" / "stsb", data / "sts" / "en" / "stsb")
    with gzip.open(shared_data / "train" / "en_paraphrase" / "multi30k_task2_en_captions.pairs.tsv.gz", "rt") as f:
        pairs = [next(f) for _ in range(3000)]
    (data / "pairs.tsv").write_text("".join(pairs), encoding="utf-8")
    (data / "lines.txt").write_text("".join(pair.split("\t")[0] + "\n" for pair in pairs), encoding="utf-8")
    script = ROOT / "benchmarks" / "bench_gpu.py"
    done = subprocess.run([sys.executable, script, "--data", data, "--dry-run"], capture_output=True, text=True)
    assert done.returncode == 0 and "FAILED" not in done.stdout, done.stdout + done.stderr[-2000:]
    figures = ["matrix products", "batch  128, M =   2 bitext", "sentences/s end to end", "| 2 | ", "start-up:",
               "cpu bf16", "the disk alone:", "table equal to cpu's: True", "equal to the straight run bit for bit: True"]  # fmt: skip
    assert all(figure in done.stdout for figure in figures), done.stdout


def test_the_ray_benchmark_finds_the_psutil_that_ray_bundles():
    """bench_ray.py counts each process's CPU through psutil, which Ray 2.60 bundles instead of installing: found in
    a fresh Python, where nothing has imported ray before."""
    need("ray")
    code = "import os, bench_ray; assert bench_ray.bundled_psutil().Process().pid == os.getpid()"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT / "benchmarks", check=True, capture_output=True)
