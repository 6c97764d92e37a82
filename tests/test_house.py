"""The house: every module's imports (function-level ones included, read with ast) go down the floors that
docs/architecture.md names, no import comes back in a loop, and train.py and every module stay short enough to read."""

import ast
import os
import re
from pathlib import Path

import pytest
from conftest import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def modules() -> dict[str, Path]:
    """Every module of the package by its name in docs/architecture.md (`fileio`, `preprocess.steps`, `__init__`)."""
    files = [p for p in ROOT.glob("*.py") if p.name != "setup.py"] + sorted((ROOT / "preprocess").rglob("*.py"))
    found = {}
    for path in files:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `path` imports, anywhere in it (`from paraphrastic import x` is module x when
    there is one, else the package itself)."""
    package = name if path.name == "__init__.py" and name != "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                up = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                base = ".".join(["paraphrastic", *[p for p in up if p], *([base] if base else [])])
            targets = [f"{base}.{a.name}" for a in node.names]  # a module, or a name in the module `base`
        else:
            continue
        for target in targets:
            if target == "paraphrastic" or target.startswith("paraphrastic."):
                short = target.removeprefix("paraphrastic").lstrip(".") or "__init__"
                while short not in known and "." in short:
                    short = short.rpartition(".")[0]
                found.add(short if short in known else "__init__")
    found.discard(name)
    return found


def floors() -> dict[str, int]:
    """Module -> floor number, from the table of docs/architecture.md."""
    found = {}
    for line in ARCHITECTURE.read_text().splitlines():
        row = re.match(r"\| (\d+) [^|]*\| ([^|]*) \|", line)
        if row:
            for name in re.findall(r"`([\w.]+)`", row.group(2)):
                assert name not in found, f"{name} is on two floors of {ARCHITECTURE.name}"
                found[name] = int(row.group(1))
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, set(known)) for name, path in known.items()}


def test_every_import_goes_down_the_floors():
    where, edges = floors(), graph()
    assert sorted(set(edges) - set(where)) == [], f"modules {ARCHITECTURE.name} leaves out"
    assert sorted(set(where) - set(edges)) == [], f"{ARCHITECTURE.name} names modules that are gone"
    up = [f"{a} ({where[a]}) -> {b} ({where[b]})" for a, deps in edges.items() for b in deps if where[b] > where[a]]
    assert up == []


def test_no_import_comes_back_in_a_loop():
    edges, state, loops = graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                loops.append(" -> ".join(path[path.index(nxt) :] + [node, nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*path, node])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    assert loops == []


def test_the_checks_see_imports_inside_functions(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from paraphrastic.models import load_model\n    import paraphrastic.train\n")
    assert imports("sample", sample, {"models", "train", "sample"}) == {"models", "train"}


def top_level_names(path: Path) -> set[str]:
    """What a module defines or imports outside its functions and classes (inside an `if` or `try` too)."""
    names, body = set(), list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            body += [n for handler in getattr(node, "handlers", []) for n in handler.body]
    return names


def test_the_scripts_and_benchmarks_import_what_the_package_has():
    """Every `from paraphrastic... import name` in scripts/ and benchmarks/, the Python inside the shell scripts
    too, names what the package has: a move of a function once left two training recipes failing at their import."""
    known, wanted = modules(), []
    for path in sorted([*(ROOT / "scripts").iterdir(), *(ROOT / "benchmarks").glob("*.py")]):
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("paraphrastic"):
                    wanted += [(path.name, node.module, a.name) for a in node.names]
        elif path.suffix == ".sh":
            for module, names in re.findall(r"from (paraphrastic[\w.]*) import ([\w, ]+)", path.read_text()):
                wanted += [(path.name, module, name.strip()) for name in names.split(",")]
    assert len(wanted) > 100
    missing = []
    for where, module, name in wanted:
        short = module.removeprefix("paraphrastic").lstrip(".") or "__init__"
        is_module = (name if short == "__init__" else f"{short}.{name}") in known  # a module of the package
        if not is_module and (short not in known or name not in top_level_names(known[short])):
            missing.append(f"{where}: from {module} import {name}")
    assert missing == []


def test_train_is_short_and_no_module_is_long():
    lengths = {name: path.read_text().count("\n") for name, path in modules().items()}
    assert lengths["train"] < 700
    assert {name: n for name, n in lengths.items() if n > 800} == {}


@pytest.mark.xdist_group("house")
def test_a_marked_group_runs_on_one_worker(request):
    """Under xdist (the README's -n 2), tests marked with one xdist_group run on one worker, so that a module's
    costly fixture (a local Ray, a browser, three training runs) is made once: pytest 9.2 silently broke that
    (pytest-xdist#1386), hence the test extra's pin."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        assert request.node.nodeid.endswith("@house"), request.node.nodeid
