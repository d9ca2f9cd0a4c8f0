"""A regular (non-editable) install holds neuron_sift only, its kernels as neuron_sift.kernels."""

import os
import subprocess
import sys
import zipfile

import pytest

from tests.helpers.subprocess_limits import LIMIT_S

ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.mark.slow
def test_wheel_installs_kernels_inside_the_package_only(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), ROOT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = list((tmp_path / "dist").glob("neuron_sift-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"neuron_sift", dist_info}
    check_metadata_states_the_tested_range(zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode())
    assert "neuron_sift/kernels/percentile.py" in names
    # every module of the source tree is in the wheel (a subpackage missing from setup.py's
    # list would import in an editable install and fail in a user's regular one)
    source = {
        os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
        for d, _, files in os.walk(os.path.join(ROOT, "neuron_sift"))
        for f in files
        if f.endswith(".py")
    }
    assert source - set(names) == set()
    # the CPU step's C kernels are compiled into the wheel (the source is not shipped)
    assert any(n.startswith("neuron_sift/kernels/_host.") and n.endswith(".so") for n in names), names
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    code = (
        "import importlib.util, neuron_sift, neuron_sift.kernels as k; "
        "import neuron_sift.integrations.schedules, neuron_sift.metrics.lightning, neuron_sift.shared.checkpoints; "
        f"assert neuron_sift.__file__.startswith({str(target)!r}), neuron_sift.__file__; "
        "outside = lambda name: (s := importlib.util.find_spec(name)) is None or not str(s.origin).startswith("
        f"{str(target)!r}); "
        "assert outside('kernels') and outside('benchmarks'); "
        f"import neuron_sift.kernels._host as h; assert h.__file__.startswith({str(target)!r}); "
        "print(k.percentile_rank.__module__)"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip() == "neuron_sift.kernels.percentile"


def legs_python_versions():
    """The Python version of every leg scripts/test.sh runs by default (its legs' own settings,
    scripts/_legs.sh, asked through bash)."""
    script = 'source scripts/_legs.sh && for leg in $ALL_LEGS; do leg_settings "$leg" && echo "$PY_VERSION"; done'
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S, check=True)
    versions = out.stdout.split()
    assert versions, out.stderr
    return versions


def check_metadata_states_the_tested_range(metadata: str):
    """The metadata admits the legs' Python range, and its torch floor is the oldest leg's torch."""
    lines = metadata.splitlines()
    pythons = sorted(legs_python_versions(), key=lambda v: tuple(map(int, v.split("."))))
    low, high = pythons[0], pythons[-1]
    major, minor = map(int, high.split("."))
    assert f"Requires-Python: >={low},<{major}.{minor + 1}" in lines
    for version in pythons:
        assert f"Classifier: Programming Language :: Python :: {version}" in lines
    # torch-xla's legs pin torch 2.9.0: the floor is the oldest torch a leg runs.
    assert "Requires-Dist: torch>=2.9" in lines
