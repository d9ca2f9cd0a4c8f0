"""Every arm comes from a plug-in of ``benchmarks/arms/``, registered one way: the module is
listed in ``PLUGINS`` and its ``register_arms(register)`` is the only place its arms are
registered. A plug-in left out of the list, a list built by a file pattern, an arm
registered by hand, or a plug-in reaching into another would each break a test here."""

import ast
import pkgutil
from pathlib import Path

import pytest

import benchmarks.arms as arms_package
from benchmarks.arms import ARMS, PLUGINS, default_arms

ARMS_DIR = Path(arms_package.__file__).resolve().parent
NOT_PLUGINS = {"registry"}  # the registry itself; every other module of benchmarks/arms/ is a plug-in

# The suite's default arms, in order: the headline table's rows and the demo's runs.
DEFAULT_ARMS = [
    "full@0.4",
    "full@0.6",
    "full@0.8",
    "full",
    "uniform",
    "sift-probabilistic",
    "sift-fixed",
    "infobatch",
    "epoch",
    "dynamic-random",
    "seta",
]


def _short(module) -> str:
    return module.__name__.rsplit(".", 1)[-1]


def _tree(name: str) -> ast.Module:
    return ast.parse((ARMS_DIR / f"{name}.py").read_text(encoding="utf-8"))


def test_the_list_of_plugins_names_every_module_of_the_arms_folder_once():
    present = {m.name for m in pkgutil.iter_modules([str(ARMS_DIR)])} - NOT_PLUGINS
    listed = [_short(p) for p in PLUGINS]
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == present, "add the new plug-in to PLUGINS in benchmarks/arms/__init__.py (or remove it)"


def test_the_list_is_written_out_not_found_by_a_file_pattern():
    init = ast.parse((ARMS_DIR / "__init__.py").read_text(encoding="utf-8"))
    (value,) = [
        node.value
        for node in init.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PLUGINS" for t in node.targets)
    ]
    assert isinstance(value, ast.Tuple | ast.List) and all(isinstance(e, ast.Name) for e in value.elts)
    assert [e.id for e in value.elts] == [_short(p) for p in PLUGINS]
    for name in ("__init__", "registry"):
        calls = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            for node in ast.walk(_tree(name))
            if isinstance(node, ast.Call)
        }
        assert not calls & {"glob", "rglob", "iterdir", "import_module", "iter_modules", "listdir"}, name


@pytest.mark.parametrize("plugin", PLUGINS, ids=_short)
def test_a_plugin_registers_only_through_the_register_it_is_handed(plugin):
    """It imports nothing from the arms package (neither the registry's ``register`` nor
    another plug-in: what plug-ins share is in ``benchmarks/core/``), and it registers
    nothing when imported, only when ``register_arms`` is called."""
    assert callable(getattr(plugin, "register_arms", None))
    for node in ast.walk(_tree(_short(plugin))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            assert not (node.module or "").startswith("benchmarks.arms"), node.module
            assert not (node.module == "benchmarks" and any(a.name == "arms" for a in node.names))
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("benchmarks.arms") for a in node.names)
    for node in _tree(_short(plugin)).body:  # module level: definitions, constants, no call of register
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and call not in node.decorator_list:
                continue
            assert getattr(call.func, "id", None) != "register", f"line {call.lineno}: registered at import"


def test_the_plugins_registrations_are_the_whole_registry_in_its_order():
    """Replaying every plug-in's ``register_arms`` into a recorder gives the registry exactly:
    no arm was added any other way, none is missing, the order is the list's."""
    recorded: list[tuple] = []

    def record(name, fn=None, *, default=False, description="", frontier=0.0, single_pass=False):
        recorded.append((name, default, description, frontier, single_pass))
        return fn if fn is not None else (lambda f: f)

    for plugin in PLUGINS:
        plugin.register_arms(record)
    assert recorded == [(s.name, s.default, s.description, s.frontier, s.single_pass) for s in ARMS.values()]


def test_the_default_arms_are_the_documented_ones_in_order():
    assert default_arms() == DEFAULT_ARMS
