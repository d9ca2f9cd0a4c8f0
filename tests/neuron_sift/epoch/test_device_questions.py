"""The epoch package asks the backend every device question (where the tables live, whether
two devices are one, how to sort): a new device kind is then one backend, not a search
through the package. (The XLA backend's answers: ``test_epoch_xla.py``.)"""

import pathlib

import torch

from neuron_sift.backends import resolve_backend
from tests.neuron_sift.epoch.helpers import ROOT

EPOCH_PACKAGE = pathlib.Path(ROOT) / "neuron_sift" / "epoch"


def test_no_device_type_tests_in_the_epoch_package():
    """Device questions go to the backend (``holds_on_host``, ``same_device``, ``sort_method``),
    in every module of the package and its sub-packages."""
    modules = sorted(EPOCH_PACKAGE.rglob("*.py"))
    assert len(modules) > 20 and EPOCH_PACKAGE / "planning" / "planner.py" in modules  # the whole package is read
    offenders = [
        str(p.relative_to(EPOCH_PACKAGE))
        for p in modules
        if any(t in p.read_text() for t in (".type ==", ".type !=", "device.type"))
    ]
    assert offenders == []


def test_the_backend_answers_the_epoch_loaders_device_questions():
    cpu = resolve_backend(torch.device("cpu"))
    assert cpu.holds_on_host and cpu.sort_method == "search"
    assert cpu.same_device(torch.device("cpu"), torch.device("cpu"))
    assert cpu.same_device(torch.device("cuda"), torch.device("cuda:1"))
    assert not cpu.same_device(torch.device("cuda:0"), torch.device("cuda:1"))
    assert not cpu.same_device(torch.device("cpu"), torch.device("cuda"))
