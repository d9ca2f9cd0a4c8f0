"""One version: neuron_sift/_version.py is the single source; the package, the packaging
metadata and the changelog agree with it."""

import re
import subprocess
import sys
from pathlib import Path

import neuron_sift
from tests.helpers.subprocess_limits import LIMIT_S

ROOT = Path(__file__).resolve().parents[1]


def test_setup_py_declares_the_package_version():
    proc = subprocess.run(
        [sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == neuron_sift.__version__


def test_changelog_has_the_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, flags=re.M)
    assert versions and versions[0] == neuron_sift.__version__, versions
