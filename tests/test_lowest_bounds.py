"""scripts/lowest_bounds.py: the oldest leg's constraints, read from setup.py and from small fakes.

The oldest leg installs exactly these pins, so a pin that is not admitted by every requirement
naming it, or a direct dependency left out, would test another stack than the metadata states.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.subprocess_limits import LIMIT_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "lowest_bounds.py")

_spec = importlib.util.spec_from_file_location("lowest_bounds", SCRIPT)
lowest_bounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lowest_bounds)

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pragma: no cover - pip's copy, as the script itself falls back to
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name


def pins(text: str) -> dict[str, str]:
    """{canonical name: version} of a constraints file's ``name==version`` lines."""
    result = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", line
        key = canonicalize_name(req.name)
        assert key not in result, f"{key} pinned twice"
        result[key] = spec.version
    return result


def write_setup(folder, body: str) -> str:
    path = os.path.join(folder, "setup.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(body))
    return path


FAKE = """
    from setuptools import Extension, setup

    # read relative to setup.py's folder, as the real one reads neuron_sift/_version.py
    VERSION = open("VERSION", encoding="utf-8").read().strip()
    setup(
        name="fake",
        version=VERSION,
        ext_modules=[Extension("fake._c", sources=["c.c"])],
        install_requires=["alpha>=1.2", "Beta_Pkg==3.0"],
        extras_require={
            "x": ["alpha>=1.5,<2", "gamma~=0.4", "beta-pkg>=2"],
            "none": ["delta"],
            "gt": ["epsilon>1"],
            "star": ["zeta==1.*"],
            "clash": ["alpha==1.0"],
            "docs": ["mkdocstrings[python]>=1.0,<2"],
        },
    )
"""


@pytest.fixture
def fake_setup(tmp_path):
    (tmp_path / "VERSION").write_text("0.1\n")
    return write_setup(str(tmp_path), FAKE)


def test_fake_each_direct_dependency_at_its_highest_lower_bound(fake_setup, tmp_path):
    # Run from elsewhere: setup.py's relative read must still find its file.
    assert os.getcwd() != str(tmp_path)
    text = lowest_bounds.constraints(fake_setup, ["x"])
    assert pins(text) == {"alpha": "1.5", "beta-pkg": "3.0", "gamma": "0.4"}
    assert lowest_bounds.constraints(fake_setup, []).splitlines()[1:] == ["alpha==1.2", "Beta_Pkg==3.0"]


def test_fake_extras_are_stripped_from_names(fake_setup):
    # pip refuses extras in a constraints file.
    assert pins(lowest_bounds.constraints(fake_setup, ["docs"]))["mkdocstrings"] == "1.0"
    assert "[" not in lowest_bounds.constraints(fake_setup, ["docs"])


@pytest.mark.parametrize(
    "extra, named",
    [
        ("none", "'delta': no lower bound"),
        ("gt", "'epsilon>1': '>' excludes its version"),
        ("star", "'zeta==1.*': a wildcard pin"),
        ("clash", "'alpha==1.0' does not admit 1.2"),
    ],
)
def test_fake_requirement_without_a_lowest_version_is_named(fake_setup, extra, named, capsys):
    with pytest.raises(lowest_bounds.NoLowerBound, match="^" + named.replace("*", r"\*").replace(".", r"\.")):
        lowest_bounds.constraints(fake_setup, [extra])
    assert lowest_bounds.main(["--setup", fake_setup, "--extras", extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and named in captured.err


def test_fake_unknown_extra_is_an_error(fake_setup, capsys):
    assert lowest_bounds.main(["--setup", fake_setup, "--extras", "x,nope"]) == 2
    assert "extra 'nope' is not declared (declared: clash, docs, gt, none, star, x)" in capsys.readouterr().err


def test_fake_setuptools_is_left_as_it_was(fake_setup):
    before = sys.modules.get("setuptools")
    lowest_bounds.setup_arguments(fake_setup)
    assert sys.modules.get("setuptools") is before


def test_setup_py_every_direct_dependency_pinned_at_a_stated_bound_all_its_requirements_admit():
    args = lowest_bounds.setup_arguments(os.path.join(ROOT, "setup.py"))
    leg = list(args["install_requires"])
    for extra in lowest_bounds.DEFAULT_EXTRAS:
        leg += args["extras_require"][extra]
    stated: dict[str, set[str]] = {}
    for line in leg:
        req = Requirement(line)
        bounds = {s.version for s in req.specifier if s.operator in (">=", "==", "~=")}
        stated.setdefault(canonicalize_name(req.name), set()).update(bounds)
    pinned = pins(lowest_bounds.constraints(os.path.join(ROOT, "setup.py")))
    assert set(pinned) == set(stated)
    for line in leg:
        req = Requirement(line)
        version = pinned[canonicalize_name(req.name)]
        assert req.specifier.contains(version, prereleases=True), (line, version)
        # the lowest: one of the bounds setup.py states, not a version of the script's choosing
        assert version in stated[canonicalize_name(req.name)], (line, version)
    # the docs extra is not the oldest leg's
    docs = {canonicalize_name(Requirement(line).name) for line in args["extras_require"]["docs"]}
    assert not set(pinned) & docs


def test_script_runs_in_an_isolated_interpreter_from_any_folder(tmp_path):
    # -I: no user site, no PYTHON* variables, as in a fresh virtual environment's first pip call.
    ran = subprocess.run(
        [sys.executable, "-I", SCRIPT], capture_output=True, text=True, cwd=str(tmp_path), timeout=LIMIT_S
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == lowest_bounds.constraints(os.path.join(ROOT, "setup.py"))
    assert "torch" in pins(ran.stdout) and "numpy" in pins(ran.stdout)
