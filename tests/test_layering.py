"""The package's structural rules (docs/architecture.md), checked on the source.

Each rule keeps one concept in one place: a rule broken here is a device question, a
private reach or an oversized module that crept back in.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = sorted((ROOT / "neuron_sift").rglob("*.py"))
BENCHMARKS = sorted((ROOT / "benchmarks").rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _code(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_only_the_backends_ask_what_a_device_is():
    """Device-type tests (``device.type == ...``, ``.type != "xla"``) and torch-xla's sync
    belong to ``neuron_sift/backends/``: everything else asks the backend object."""
    asks = re.compile(r"\.type\s*[!=]=|torch_xla\.sync\(|xm\.mark_step\(")
    offenders = [
        f"{_rel(p)}:{i}: {line.strip()}"
        for p in PACKAGE
        if not _rel(p).startswith("neuron_sift/backends/")
        for i, line in enumerate(_code(p).splitlines(), 1)
        if asks.search(line)
    ]
    assert offenders == []


@pytest.mark.parametrize("path", PACKAGE + BENCHMARKS, ids=_rel)
def test_no_module_is_over_about_350_lines(path):
    assert len(_code(path).splitlines()) <= 360, "split it along a real seam"


def test_the_loader_object_is_thin():
    """The loader keeps arguments, len, the plan and the state API; the epoch's work is in
    its parts. A method doing the epoch's work would show up as a call into the engine or
    the pending store from the loader module."""
    loader = _code(ROOT / "neuron_sift" / "dataloader" / "sift_dataloader.py")
    for call in ("sifter.step(", ".read_selection(", ".read_kept(", ".pop(", ".reverse_transform("):
        assert call not in loader, call


def _imports(path: Path, package_dirs: dict[str, Path]) -> set[Path]:
    """The files ``path`` imports (at any depth of the module: TYPE_CHECKING and function-level
    imports count, as a reader follows them too) among ``package_dirs`` (top-level name -> folder)."""
    tree = ast.parse(_code(path))
    found: set[Path] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            top, *rest = name.split(".")
            if top not in package_dirs:
                continue
            base = package_dirs[top].joinpath(*rest)
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file() and candidate != path:
                    found.add(candidate)
    return found


def _graph(files: list[Path], package_dirs: dict[str, Path]) -> dict[Path, set[Path]]:
    # A package's __init__.py only hands names on (the public API in one place): not a room.
    return {
        p: {q for q in _imports(p, package_dirs) if q.name != "__init__.py"} for p in files if p.name != "__init__.py"
    }


def _circles(graph: dict[Path, set[Path]]) -> list[list[str]]:
    """Strongly connected sets of more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    out: list[list[str]] = []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(_rel(w))
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


PACKAGE_DIRS = {"neuron_sift": ROOT / "neuron_sift"}


def test_no_files_of_the_package_import_each_other_in_a_circle():
    assert _circles(_graph(PACKAGE, PACKAGE_DIRS)) == []


def test_no_files_of_the_benchmarks_import_each_other_in_a_circle():
    graph = _graph(BENCHMARKS, {"benchmarks": ROOT / "benchmarks"})
    assert any(graph.values())  # the graph sees the benchmarks' imports of each other
    assert _circles(graph) == []


def _folder(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return "/".join(rel[:2]) if rel[0] == "neuron_sift" and len(rel) > 2 else rel[0] if len(rel) > 1 else _rel(path)


def test_folders_stand_in_layers_no_arrow_runs_back_up():
    """Between folders every arrow points one way: the folders' import graph has no circle."""
    folders: dict[Path, set[Path]] = {}
    for src, targets in _graph(PACKAGE, PACKAGE_DIRS).items():
        for dst in targets:
            a, b = _folder(src), _folder(dst)
            if a != b:
                folders.setdefault(Path(ROOT / a), set()).add(Path(ROOT / b))
    assert _circles(folders) == []


def test_the_two_modes_are_wings_that_do_not_import_each_other():
    graph = _graph(PACKAGE, PACKAGE_DIRS)
    per_batch = ("neuron_sift/dataloader",)
    epoch = ("neuron_sift/epoch",)
    crossing = [
        f"{_rel(a)} -> {_rel(b)}"
        for a, targets in graph.items()
        for b in targets
        if (_folder(a) in per_batch and _folder(b) in epoch) or (_folder(a) in epoch and _folder(b) in per_batch)
    ]
    assert crossing == []


# The epoch wing's rooms, top to bottom (``neuron_sift/epoch/__init__.py``): each imports only
# rooms below it (or itself); the shims of moved modules import nothing of the wing.
EPOCH_ROOMS = ("loader", "score_table", "resuming", "running", "scores", "planning", "selection", "user_data")


def _epoch_room(path: Path) -> str | None:
    rel = path.relative_to(ROOT / "neuron_sift" / "epoch").parts if "epoch" in path.parts else ()
    if not rel or rel[0] == "__init__.py":
        return None
    return rel[0].removesuffix(".py")


def test_the_epoch_wings_rooms_each_import_only_rooms_below_them():
    epoch = ROOT / "neuron_sift" / "epoch"
    files = sorted(epoch.rglob("*.py"))
    rooms = {p: _epoch_room(p) for p in files}
    assert {r for r in rooms.values() if r is not None} - {"planner", "quantiles", "sharded"} == set(EPOCH_ROOMS)
    upward = []
    for src, targets in _graph(files, PACKAGE_DIRS).items():
        for dst in targets:
            a, b = rooms.get(src), rooms.get(dst)
            if dst.is_relative_to(epoch) and a != b:
                if a not in EPOCH_ROOMS or b not in EPOCH_ROOMS or EPOCH_ROOMS.index(b) < EPOCH_ROOMS.index(a):
                    upward.append(f"{_rel(src)} -> {_rel(dst)}")
    assert upward == []


def test_the_epoch_wings_sub_packages_say_what_they_own():
    for room in EPOCH_ROOMS:
        init = ROOT / "neuron_sift" / "epoch" / room / "__init__.py"
        if init.parent.is_dir():
            doc = ast.get_docstring(ast.parse(_code(init)))
            assert doc and len(doc.splitlines()) == 1, f"{_rel(init)}: a one-line docstring saying what it owns"


def test_the_score_table_is_chosen_in_one_place():
    """Only the registry reads ``score_table``'s value; the rest asks what it built."""
    readers = [
        f"{_rel(p)}:{i}"
        for p in PACKAGE
        if p.is_relative_to(ROOT / "neuron_sift" / "epoch") and p.name != "score_table.py"
        for i, line in enumerate(_code(p).splitlines(), 1)
        if re.search(r"isinstance\([^)]*Sharded|score_table\s*[!=]=|== \"sharded\"", line)
    ]
    assert readers == []
