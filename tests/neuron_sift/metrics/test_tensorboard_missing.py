"""``write_tensorboard`` where the ``tensorboard`` package is not installed: a log directory
gets an ImportError that names the package and how to install it (torch's own is a bare
``No module named 'tensorboard'``); a writer object needs no package at all."""

import importlib.abc
import sys

import pytest

from neuron_sift.metrics import collect_metrics, write_tensorboard
from tests.neuron_sift.epoch.helpers import small_parts

MISSING = ("tensorboard", "torch.utils.tensorboard")


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Finds nothing under ``MISSING``, as on a machine without the package."""

    def find_spec(self, name, path=None, target=None):
        if name in MISSING or name.startswith(tuple(m + "." for m in MISSING)):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def without_tensorboard(monkeypatch):
    """The package made unimportable for one test; the modules already imported come back after it."""
    for name in list(sys.modules):
        if name in MISSING or name.startswith(tuple(m + "." for m in MISSING)):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NotInstalled(), *sys.meta_path])
    with pytest.raises(ModuleNotFoundError):
        import torch.utils.tensorboard  # noqa: F401  # the simulation holds: torch's import fails


def test_a_log_directory_without_tensorboard_says_which_package_to_install(without_tensorboard, tmp_path):
    _model, _opt, loader = small_parts(2)
    snap = collect_metrics(loader)
    with pytest.raises(ImportError, match=r"needs the tensorboard package: pip install tensorboard") as raised:
        write_tensorboard(snap, tmp_path / "tb")
    assert "add_scalar" in str(raised.value)  # the other way: a writer object
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)  # torch's own error kept as the cause
    assert not (tmp_path / "tb").exists()

    class Writer:
        def __init__(self):
            self.calls = {}

        def add_scalar(self, tag, value, step):
            self.calls[tag] = value

    writer = Writer()
    write_tensorboard(snap, writer)  # a writer object needs no tensorboard package
    assert writer.calls == snap.scalars("epoch_sifting/")
