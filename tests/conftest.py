"""Shared fixtures. Tests mirror the package: tests/kernels for kernels/, tests/neuron_sift/... for neuron_sift/."""

import os

import pytest
import torch

# torch-xla's CPU backend is the CI stand-in for an XLA device (Trainium).
os.environ.setdefault("PJRT_DEVICE", "CPU")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
