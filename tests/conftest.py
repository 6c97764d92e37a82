"""Shared fixtures: a tiny generated corpus, a sentencepiece model trained on it, a tiny model file,
and the path of the real data in ../shared/data (skipped when absent, a failure under CI=true)."""

from __future__ import annotations

import compileall
import contextlib
import importlib
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from paraphrastic import pieces, workers

if TYPE_CHECKING:  # torch is imported by the fixtures that need it: pytest-xdist's controller runs no test
    from paraphrastic import models

ROOT = Path(__file__).resolve().parents[1]

# Every Ray of the tests stays on loopback: with this set before Ray is imported, Ray keeps 127.0.0.1 for its
# nodes and its drivers instead of swapping in the machine's network address (its drivers inherit it too).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

SHARED_DATA = Path(os.environ.get("PARAPHRASTIC_DATA", ROOT.parent / "shared" / "data"))

SUBJECTS = ["a man", "the woman", "two dogs", "a young girl", "the old chef", "three kids", "a cyclist"]
VERBS = ["is riding", "is cooking", "is playing with", "is walking past", "is looking at", "is painting"]
OBJECTS = ["a red bicycle", "the blue ball", "some fresh bread", "a tall building", "the quiet river"]
PLACES = ["in the park", "at the beach", "near the station", "on a sunny day", "inside the kitchen"]


def pytest_configure(config) -> None:
    """Compile the package's modules once, in the process that runs the workers: the hundreds of commands the tests
    start then read them compiled, also where PYTHONDONTWRITEBYTECODE is set (each compiled them anew: 0.1 s)."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(ROOT, maxlevels=0, quiet=1)


# The xdist groups (each runs whole on one worker), longest first: xdist hands work out in collection order, and the
# ray group (about a minute and a half) collected last left the other worker idle at the end. The Ray tests are two
# groups, one a module, each on a worker with a Ray of its own: as one they were the suite's whole wall time
LONG_GROUPS = ["ray", "ray-jobs", "ddp", "demo", "install"]


def pytest_collection_modifyitems(items: list) -> None:
    """Collect the long groups first, in LONG_GROUPS' order, then the tests marked long (ten seconds or more each:
    one started last kept the other worker idle for as long), then every other test, each in its own order."""

    def rank(item) -> int:
        group = item.get_closest_marker("xdist_group")
        name = group.args[0] if group else None
        if name in LONG_GROUPS:
            return LONG_GROUPS.index(name)
        return len(LONG_GROUPS) + (item.get_closest_marker("long") is None)

    items.sort(key=rank)


def generated_sentences(n: int, seed: int = 0) -> list[str]:
    """Template sentences from a small word list: generated fixture text, not real data."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(PLACES)]
        sentence = " ".join(words) + rng.choice([".", "!", ""])
        out.append(sentence.capitalize() if rng.random() < 0.5 else sentence)
    return out


CARD = ROOT / "data" / "models" / "README.md"


def dead_pid() -> int:
    """The id of a process that has ended (what a killed run's temporary names)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def open_rows_files() -> list[str]:
    """This process's open files and mapped files that are encode's rows (a memfd shows as "/memfd:NAME (deleted)")."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    with open("/proc/self/maps") as maps:
        found += [line.split(maxsplit=5)[-1] for line in maps]
    return [name for name in found if workers.SHARED_ROWS in name]


def stated_figure(name: str) -> float:
    """A figure of the model card's line `<name>: <number>`."""
    match = re.search(rf"^{re.escape(name)}: ([0-9.]+)$", CARD.read_text(encoding="utf-8"), re.M)
    assert match, f"{CARD} states no '{name}: ...' line"
    return float(match.group(1))


def shared_data_or_skip() -> Path:
    """The real data folder; a skip when absent, but a failure under CI=true."""
    if SHARED_DATA.is_dir():
        return SHARED_DATA
    if os.environ.get("CI") == "true":
        pytest.fail(f"{SHARED_DATA} is missing: CI must have ../shared/data")
    pytest.skip(f"{SHARED_DATA} not present")


def need(module: str):
    """Import an optional extra's module: a skip where it is not installed, a failure under CI=true (CI
    installs every extra, so its tests must run there)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def ray_session():
    """The xdist worker's local Ray, shut down when its tests end (local_ray starts it)."""
    yield
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


@pytest.fixture
def local_ray(ray_session) -> str:
    """One local Ray with 2 CPUs for the tests of a Ray group (each group runs whole on one xdist worker): the first
    test that asks starts it (5 s), the rest share it, and a test that shut it down for a Ray of its own leaves it to
    start again. Its address, for drivers in other processes."""
    ray = need("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    address = ray.get_runtime_context().gcs_address
    assert address.startswith("127.0.0.1:")  # loopback only (above)
    return address


@pytest.fixture
def shared_data() -> Path:
    return shared_data_or_skip()


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(s.lower() for s in generated_sentences(400)) + "\n")
    return path


@pytest.fixture(scope="session")
def sp_bytes(corpus_file) -> bytes:
    return pieces.train_sentencepiece(corpus_file, vocab_size=120, num_threads=1)


@pytest.fixture
def sp_file(sp_bytes, tmp_path) -> Path:
    path = tmp_path / "sp.model"
    path.write_bytes(sp_bytes)
    return path


@pytest.fixture
def pairs_file(tmp_path) -> Path:
    """300 generated sentence pairs, one per line (modules that need other pairs define their own)."""
    path = tmp_path / "pairs.tsv"
    src, tgt = generated_sentences(300, seed=3), generated_sentences(300, seed=4)
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)))
    return path


@pytest.fixture
def tiny_model(sp_bytes) -> models.SPModel:
    import torch

    from paraphrastic import models

    torch.manual_seed(0)
    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    return models.SPModel(tokenizer, torch.randn(len(tokenizer), 16))


@pytest.fixture
def tiny_model_file(tiny_model, tmp_path) -> Path:
    path = tmp_path / "tiny.pt"
    tiny_model.save(path)
    return path


def sp_model(sp_bytes: bytes, dim: int = 4) -> models.SPModel:
    """An SP model with a zero table: enough to tokenize with."""
    import torch

    from paraphrastic import models

    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    return models.SPModel(tokenizer, torch.zeros(len(tokenizer), dim))


EVERY_EXTRA = "test,preprocess,interop,teacher,multilingual,mine,demo,ray,integrations"  # what .ci/run installs


def pytest_terminal_summary(terminalreporter) -> None:
    """One line saying why tests were skipped (an extra not installed, the real data absent), with counts, so
    that a skip is never silent."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        found = re.search(r"could not import '([\w.]+)'", reason)
        key = f"{found.group(1).split('.')[0]} not installed" if found else reason.removeprefix("Skipped: ")[:60]
        reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        listed = "; ".join(f"{why} ({n})" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        terminalreporter.write_line(f'skipped: {listed} (every extra: pip install -e ".[{EVERY_EXTRA}]")')
