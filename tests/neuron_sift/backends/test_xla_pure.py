"""The selection step traced once on torch-xla (``backends/xla_pure.py``): used, built once
per shape, bit-identical to tracing op by op, and a logged fallback where torch-xla lacks it."""

import logging

import pytest
import torch

try:  # without torch-xla these tests are deselected by scripts/test.sh, skipped by tests/conftest.py
    import torch_xla
except ImportError:
    torch_xla = None

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader  # noqa: E402
from neuron_sift.backends import xla_pure  # noqa: E402
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader  # noqa: E402

pytestmark = pytest.mark.xla

MODES = ["probabilistic", "fixed"]


def run(losses, mode, trace_once, epochs=3, history=64, batch_size=32):
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=history,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            selection_mode=mode,
            seed=5,
        ),
        orig_dataloader=loss_table_loader(losses, batch_size),
        loss_impl=OracleLoss(),
        model=torch.nn.Linear(1, 1).to(torch_xla.device()),
    )
    loader.backend.trace_once = trace_once
    traced = []
    ids = []
    for _ in range(epochs):
        ids += [b.cpu().tolist() for b, _ in loader]
        traced.append((len(loader.backend.pure_steps.signatures), xla_pure.built()))
    state = {k: v.cpu() for k, v in loader.sifter.state.tensors().items()}
    return ids, traced, state


@pytest.mark.parametrize("mode", MODES)
def test_traced_once_is_bit_identical_to_tracing_every_call(mode):
    """1000 % 32 = 8: a short last batch every epoch, padded to the same shape."""
    losses = torch.rand(1000, generator=torch.Generator().manual_seed(2))
    losses[[17, 400]] = float("nan")
    once, traced, state_once = run(losses, mode, trace_once=True)
    every, untraced, state_every = run(losses, mode, trace_once=False)
    # one computation, built (or found, when an earlier test built it) in the first epoch, never again
    assert [n for n, _ in traced] == [1, 1, 1] and len({b for _, b in traced}) == 1
    assert [n for n, _ in untraced] == [0, 0, 0]
    assert once == every
    assert all(torch.equal(state_once[k], state_every[k]) for k in state_once)


@pytest.mark.parametrize("mode", MODES)
def test_long_history_step_traced_once_matches(mode):
    """The chunked merge percentile (B x H above the pairwise size) inside the traced step."""
    losses = torch.rand(2 * 300, generator=torch.Generator().manual_seed(3))
    once, _, _ = run(losses, mode, trace_once=True, epochs=2, history=20000, batch_size=300)
    every, _, _ = run(losses, mode, trace_once=False, epochs=2, history=20000, batch_size=300)
    assert once == every


def test_missing_assume_pure_falls_back_with_one_log_line(monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_assume_pure(name, *args, **kwargs):
        if name == "torch_xla.experimental.assume_pure":
            raise ImportError("no assume_pure in this torch-xla")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_assume_pure)
    monkeypatch.setattr(xla_pure, "_warned", False)
    monkeypatch.setattr(xla_pure, "_PURE", {})  # as in a fresh process: nothing traced yet
    losses = torch.rand(200, generator=torch.Generator().manual_seed(4))
    with caplog.at_level(logging.WARNING, logger="neuron_sift.backends.xla_pure"):
        ids, traced, _ = run(losses, "fixed", trace_once=True, epochs=2)
        ids2, _, _ = run(losses, "fixed", trace_once=True, epochs=1)
    lines = [r for r in caplog.records if "assume_pure_torch is not available" in r.getMessage()]
    assert len(lines) == 1
    assert [n for n, _ in traced] == [0, 0]
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert ids == run(losses, "fixed", trace_once=True, epochs=2)[0]
