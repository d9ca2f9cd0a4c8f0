"""A regular (non-editable) install holds neuron_sift only, with kernels/ as neuron_sift.kernels."""

import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.mark.slow
def test_wheel_installs_kernels_inside_the_package_only(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), ROOT],
        capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = list((tmp_path / "dist").glob("neuron_sift-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"neuron_sift", dist_info}
    assert "neuron_sift/kernels/percentile.py" in names
    # the CPU step's C kernels are compiled into the wheel (the source is not shipped)
    assert any(n.startswith("neuron_sift/kernels/_host.") and n.endswith(".so") for n in names), names
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    code = (
        "import importlib.util, neuron_sift, neuron_sift.kernels as k; "
        "assert neuron_sift.__file__.startswith(%r), neuron_sift.__file__; "
        "assert importlib.util.find_spec('kernels') is None and importlib.util.find_spec('benchmarks') is None; "
        "import neuron_sift.kernels._host as h; assert h.__file__.startswith(%r); "
        "print(k.percentile_rank.__module__)" % (str(target), str(target))
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip() == "neuron_sift.kernels.percentile"
