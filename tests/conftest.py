"""Shared fixtures. Tests mirror the package: tests/kernels for kernels/, tests/neuron_sift/... for neuron_sift/."""

import os

import pytest
import torch

# torch-xla's CPU backend is the CI stand-in for an XLA device (Trainium).
os.environ.setdefault("PJRT_DEVICE", "CPU")


def pytest_configure(config):
    """CI sets NEURON_SIFT_REQUIRE_XLA=1: a missing torch-xla then fails the run instead of skipping."""
    if os.environ.get("NEURON_SIFT_REQUIRE_XLA") == "1":
        try:
            import torch_xla  # noqa: F401
        except ImportError as exc:
            raise pytest.UsageError(f"NEURON_SIFT_REQUIRE_XLA=1 but torch_xla cannot be imported: {exc}")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
