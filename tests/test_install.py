"""A plain (non-editable) install, as a new user gets it: a wheel built from the checkout, installed into a
fresh virtual environment, run from a folder outside the checkout."""

import configparser
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

# One worker runs the module, so that the wheel and its environment are built once
pytestmark = pytest.mark.xdist_group("install")


def run(*cmd, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(map(str, cmd)), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, virtual environment's bin folder) of a wheel installed into a new environment. The environment
    sees the packages of the interpreter running the tests (torch and the other dependencies, already installed;
    copying torch alone takes a minute), whether that is a base Python or a virtual environment, but the package
    itself must come from the wheel."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "paraphrastic"  # a clean copy: the checkout's own build/ (an editable install's) stays out of it
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "runs", ".*cache*"))
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", source)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("paraphrastic-*.whl")
    venv.create(tmp / "env")  # pip comes from the packages it sees, below
    bin_dir = tmp / "env" / "bin"
    see_our_packages(bin_dir)
    done = run(bin_dir / "python", "-m", "pip", "install", "-q", "--no-index", wheel)  # nothing to fetch
    assert done.returncode == 0, done.stderr[-2000:]
    return wheel, bin_dir


def see_our_packages(bin_dir) -> None:
    """Put this interpreter's site-packages after the new environment's own on its path, by a .pth file of plain
    folder lines. (system_site_packages would show the base Python's packages, not those of a virtual environment
    the tests run in; plain lines run none of that folder's .pth files, so an editable install of the checkout
    stays out of sight.)"""
    where = run(bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(where.stdout.strip()) / "zz-test-parent.pth").write_text("".join(f"{p}\n" for p in ours))


def test_wheel_holds_one_package_with_the_shipped_model(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"paraphrastic", wheel.name.split("-py")[0] + ".dist-info"}
    for needed in ["__init__.py", "models.py", "distributed.py", "data/models/default.pt", "preprocess/steps.py"]:
        assert f"paraphrastic/{needed}" in names
    assert "paraphrastic/setup.py" not in names


def test_every_console_command_has_help_with_defaults_and_an_example(installed):
    wheel, bin_dir = installed
    entry_points = configparser.ConfigParser()
    dist_info = wheel.name.split("-py")[0] + ".dist-info"
    entry_points.read_string(zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode())
    commands = list(entry_points["console_scripts"])
    assert len(commands) >= 6
    for command in commands:
        done = run(bin_dir / command, "--help")
        assert done.returncode == 0, (command, done.stderr[-2000:])
        assert done.stdout.startswith(f"usage: {command}") and "example:" in done.stdout, command
        assert "default" in done.stdout or command == "paraphrastic-export", command


def test_installed_commands_embed_and_score_the_example_files_elsewhere(installed, tmp_path):
    _, bin_dir = installed
    examples = ROOT / "data"
    out = tmp_path / "vectors.npy"
    done = run(
        bin_dir / "paraphrastic-embed",
        "--sentence-file",
        examples / "example-sentences.txt",
        "--output-file",
        out,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (examples / "example-sentences.txt").read_text().splitlines()
    assert np.load(out).shape[0] == len(lines)
    done = run(
        bin_dir / "paraphrastic-score", "--sentence-pair-file", examples / "example-sentences-pairs.txt", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pairs = (examples / "example-sentences-pairs.txt").read_text().splitlines()
    assert len(done.stdout.splitlines()) == len(pairs)
    code = "import paraphrastic, sys; m = paraphrastic.load_model(); print(m.similarity(['a'], ['a'])[0, 0]); print(sys.modules['paraphrastic'].__file__)"
    done = run(bin_dir / "python", "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    score, where = done.stdout.split()
    assert float(score) == pytest.approx(1.0) and str(bin_dir.parent) in where, "the installed copy, not the checkout"
    done = run(bin_dir / "python", "-c", "import models", cwd=tmp_path)
    assert done.returncode != 0, "no top-level module named `models` is installed"
