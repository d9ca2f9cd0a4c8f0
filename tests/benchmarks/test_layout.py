"""The benchmarks' folders: the entry scripts on top (the commands the docs give), everything
else in sub-packages that each say what they own and import one another one way only, so a
newcomer reads them bottom up: instruments and report, the tasks, core, arms (and the studies'
parts), the scripts; beside the scripts only ``_bootstrap.py``, their first import."""

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SUBPACKAGES = sorted(p.parent.name for p in BENCH.glob("*/__init__.py"))

# What each sub-package may import of benchmarks (besides itself); the scripts on top may import all.
MAY_IMPORT = {
    "instruments": set(),
    "report": set(),
    "tasks": set(),
    "core": {"instruments", "report", "tasks"},
    "arms": {"core", "instruments", "tasks"},
    "studies": {"core", "instruments", "report", "tasks"},
}


def _benchmarks_imports(path: Path) -> set[str]:
    """The benchmarks sub-packages (or top-level modules) ``path`` imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            module = node.module or ""
            names = [f"{module}.{a.name}" for a in node.names] if module == "benchmarks" else [module]
        found |= {n.split(".")[1] for n in names if n.startswith("benchmarks.")}
    return found


def test_the_sub_packages_are_the_known_ones():
    assert SUBPACKAGES == sorted(MAY_IMPORT)


def test_on_top_only_entry_scripts():
    for path in BENCH.glob("*.py"):
        if path.name not in ("__init__.py", "_bootstrap.py"):
            assert 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"), (
                f"{path.name} is not an entry script: move it into a sub-package"
            )


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_each_sub_package_says_in_one_line_what_it_owns(package):
    doc = ast.get_docstring(ast.parse((BENCH / package / "__init__.py").read_text(encoding="utf-8")))
    assert doc and "\n" not in doc.strip()


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_sub_packages_import_one_way_only(package):
    for path in sorted((BENCH / package).glob("*.py")):
        reached = _benchmarks_imports(path) - {package}
        assert reached <= MAY_IMPORT[package], f"{path.relative_to(BENCH)} imports {sorted(reached)}"
