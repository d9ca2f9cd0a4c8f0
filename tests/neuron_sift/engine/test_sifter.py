"""The Sifter: which step runs where, and that the choice never changes what is selected."""

import pytest
import torch

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.backends import EagerBackend
from neuron_sift.engine import cpu_step
from neuron_sift.engine import sifter as sifter_module
from neuron_sift.engine.cpu_step import host_kernels_available
from neuron_sift.engine.sifter import Sifter
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader, tiny_model


def config(mode, history=64):
    return RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=history,
        loss_based_sift_config={"sift_config": {"sift_delay": 2}},
        selection_mode=mode,
        seed=11,
    )


needs_kernels = pytest.mark.skipif(
    not host_kernels_available(),
    reason="neuron_sift.kernels._host was not built (no C compiler at install); CI requires it",
)


def run(mode, host_step, epochs=3):
    g = torch.Generator().manual_seed(4)
    losses = torch.rand(250, generator=g)  # 250 = 7 batches of 32 + a short one of 26
    losses[[5, 77, 140]] = float("nan")
    losses[200] = float("inf")
    loader = SiftingDataloader(
        sift_config=config(mode),
        orig_dataloader=loss_table_loader(losses, 32),
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )
    if host_step is not None:  # None: the loader's own choice
        loader.sifter = Sifter(loader.sift_config, loader.backend, loader.ranks, host_step=host_step)
    batches = [ids.tolist() for _ in range(epochs) for ids, _ in loader]
    return batches, loader


@needs_kernels
def test_the_cpu_runs_the_host_step_and_other_devices_cannot():
    cpu = EagerBackend(torch.device("cpu"))
    assert Sifter(config("fixed"), cpu)._on_host
    assert not Sifter(config("fixed"), cpu, host_step=False)._on_host
    meta = EagerBackend(torch.device("meta"))
    with pytest.raises(ValueError, match="needs a CPU device"):
        Sifter(config("fixed"), meta, host_step=True)


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
@needs_kernels
def test_host_and_torch_steps_emit_the_same_batches(mode):
    """The CPU's host step and the torch step (what CUDA and XLA run) select the same samples:
    delay, filling and wrapping history, short last batch, non-finite losses, three epochs."""
    host_batches, host = run(mode, host_step=True)
    torch_batches, dev = run(mode, host_step=False)
    assert host_batches == torch_batches
    a, b = host.state_dict(), dev.state_dict()
    for name, t in a["sift_state"].items():
        assert torch.equal(t, b["sift_state"][name]), name
    # 4 non-finite losses per epoch; the first epoch's first 2 batches are the delay (not scored)
    assert a["counts"] == b["counts"] and a["counts"]["num_nonfinite_losses"] == 3 + 4 + 4


@needs_kernels
def test_state_is_a_snapshot_and_loads_back():
    _, loader = run("probabilistic", host_step=True, epochs=1)
    sifter = loader.sifter
    snapshot = sifter.state
    snapshot.history.zero_()  # a copy: the sifter's own history is untouched
    assert sifter.state.history.abs().sum() > 0
    again = Sifter(loader.sift_config, loader.backend, host_step=True)
    again.state = sifter.state
    for name, t in sifter.state.tensors().items():
        assert torch.equal(t, again.state.tensors()[name]), name


# -- without the C kernels ------------------------------------------------------------------
# Depends on the Sifter choosing the step with cpu_step.host_kernels_available(): until that
# lands, the loader tries to build a HostSiftState and this test fails with its RuntimeError.


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
def test_without_the_kernels_the_cpu_falls_back_to_the_torch_step(mode, monkeypatch):
    """A CPU model where the extension was not built: the loader runs the torch step on the
    CPU and selects exactly what the host step (and the torch step) select."""
    want, reference = run(mode, host_step=False)
    if host_kernels_available():
        assert run(mode, host_step=True)[0] == want  # the host step's selections, too
    # _host = None makes host_kernels_available() False wherever it is imported from, and
    # a HostSiftState impossible to make.
    monkeypatch.setattr(cpu_step, "_host", None)
    monkeypatch.setattr(cpu_step, "host_kernels_available", lambda: False)
    monkeypatch.setattr(sifter_module, "host_kernels_available", lambda: False, raising=False)
    got, loader = run(mode, host_step=None)
    assert not loader.sifter._on_host
    assert got == want
    a, b = loader.state_dict(), reference.state_dict()
    for name, t in a["sift_state"].items():
        assert torch.equal(t, b["sift_state"][name]), name
    assert a["counts"] == b["counts"]
