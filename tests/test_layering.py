"""The package's structural rules (docs/architecture.md), checked on the source.

Each rule keeps one concept in one place: a rule broken here is a device question, a
private reach or an oversized module that crept back in.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = sorted((ROOT / "neuron_sift").rglob("*.py")) + sorted((ROOT / "kernels").glob("*.py"))
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


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
def test_no_module_is_over_about_400_lines(path):
    assert len(_code(path).splitlines()) <= 420, "split it along a real seam"


def test_the_loader_object_is_thin():
    """The loader keeps arguments, len, the plan and the state API; the epoch's work is in
    its parts. A method doing the epoch's work would show up as a call into the engine or
    the pending store from the loader module."""
    loader = _code(ROOT / "neuron_sift" / "dataloader" / "sift_dataloader.py")
    for call in ("sifter.step(", ".read_selection(", ".read_kept(", ".pop(", ".reverse_transform("):
        assert call not in loader, call
