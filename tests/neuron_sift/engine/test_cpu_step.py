"""The CPU's host step (C kernels) against the torch step: identical, bit for bit.

Where the C kernels were not built, the CPU runs the torch step itself, so the two
implementations tested here are the only ones.

Every output and every state tensor is compared with ``torch.equal`` after each step of
long sequences that pass through every regime: an empty and a filling history, a full
one that wraps, more values than slots in one batch, short (padded) batches, ties,
NaN/inf/-0.0 losses, every mode, beta from 0.25 to 10, and the global-history inputs.
"""

import os

import numpy as np
import pytest
import torch

from neuron_sift.engine import cpu_step
from neuron_sift.engine.cpu_step import HostSiftState, host_kernels_available, sift_step_cpu
from neuron_sift.engine.state import SiftState
from neuron_sift.engine.step import sift_step

MODES = ["probabilistic", "fixed", "topk"]

needs_kernels = pytest.mark.skipif(
    not host_kernels_available(),
    reason="neuron_sift.kernels._host was not built (no C compiler at install); CI requires it",
)


def assert_same(state, out, host, host_out):
    """The torch step's state and selection equal the host step's, bit for bit."""
    mine = host.to_state()
    for name, t in state.tensors().items():
        other = mine.tensors()[name]
        assert t.dtype == other.dtype and t.shape == other.shape, name
        assert torch.equal(t, other), name
    count = int(out.count)
    assert torch.equal(out.order[:count], torch.from_numpy(host_out.kept)), "kept rows"
    assert int(out.num_nonfinite) == host_out.num_nonfinite


def losses_like(g, rows, kind):
    if kind == "ties":  # few distinct values: many equal to history entries
        return torch.randint(0, 4, (rows,), generator=g).float() / 4
    x = torch.rand(rows, generator=g) * 3
    if kind == "special":
        pick = torch.randint(0, 12, (rows,), generator=g)
        x = torch.where(pick == 0, torch.tensor(float("nan")), x)
        x = torch.where(pick == 1, torch.tensor(float("inf")), x)
        x = torch.where(pick == 2, torch.tensor(float("-inf")), x)
        x = torch.where(pick == 3, torch.tensor(-0.0), x)
        x = torch.where(pick == 4, torch.tensor(0.0), x)
    return x


def run_both(mode, beta, rows, history, steps, kind, seed, dtype=torch.float32, shared_ranks=0):
    g = torch.Generator().manual_seed(seed)
    a = SiftState.create(history, seed * 7 + 3, torch.device("cpu"))
    b = HostSiftState.from_state(a)
    beta_t = torch.tensor([beta], dtype=torch.float32)[0]
    k = max(1, int(rows / (1 + beta) + 0.5))
    for step in range(steps):
        n_valid = rows if step % 5 else int(torch.randint(1, rows + 1, (1,), generator=g))
        n_take = min(max(0, int(n_valid / (1 + beta) + 0.5)), k) if mode != "probabilistic" else 0
        losses = losses_like(g, rows, kind).to(dtype)
        losses[n_valid:] = 0.0  # padding, as the Sifter pads
        shared_l = shared_v = None
        if shared_ranks:
            shared_l = torch.cat([losses.float()] + [losses_like(g, rows, kind) for _ in range(shared_ranks - 1)])
            counts = [n_valid] + [int(torch.randint(1, rows + 1, (1,), generator=g)) for _ in range(shared_ranks - 1)]
            shared_v = (torch.arange(rows).unsqueeze(0) < torch.tensor(counts).unsqueeze(1)).reshape(-1)
        per_batch = torch.tensor([n_valid, n_take])
        a, out_a = sift_step(a, losses, per_batch[0], beta_t, mode, k, per_batch[1], shared_l, shared_v)
        out_b = sift_step_cpu(b, losses, n_valid, beta_t, mode, k, n_take, shared_l, shared_v)
        assert_same(a, out_a, b, out_b)
    return a


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("beta", [0.25, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("kind", ["uniform", "ties", "special"])
def test_identical_to_the_torch_step(mode, beta, kind):
    # H=50 with B=32: fills in two steps, then wraps every step; both percentile kernels
    # of the torch step (pairwise below 65536 cells, sorted above) are covered below.
    state = run_both(mode, beta, rows=32, history=50, steps=40, kind=kind, seed=int(beta * 4))
    assert int(state.fill) == 50


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
def test_identical_with_the_sorted_percentile_kernel(mode):
    run_both(mode, 1.0, rows=256, history=512, steps=12, kind="ties", seed=5)
    run_both(mode, 2.0, rows=256, history=300, steps=6, kind="special", seed=6)


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
def test_identical_when_a_batch_overfills_the_history(mode):
    run_both(mode, 1.0, rows=64, history=20, steps=10, kind="uniform", seed=1)


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_identical_for_other_loss_dtypes(mode, dtype):
    run_both(mode, 1.0, rows=16, history=40, steps=8, kind="uniform", seed=2, dtype=dtype)


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
def test_identical_with_a_global_history(mode):
    run_both(mode, 1.0, rows=16, history=40, steps=10, kind="special", seed=3, shared_ranks=3)


@needs_kernels
def test_identical_at_the_benchmark_size():
    """B = 256, H = 4096 (benchmarks/machinery.py's default row): the sorted percentile
    kernel on the torch side, a history that fills, then wraps; every mode."""
    for mode in MODES:
        run_both(mode, 1.0, rows=256, history=4096, steps=20, kind="uniform", seed=8)


@needs_kernels
def test_host_state_round_trips_and_copies():
    state = SiftState.create(8, 5, torch.device("cpu"))
    host = HostSiftState.from_state(state)
    sift_step_cpu(host, torch.rand(6), 6, torch.tensor(1.0), "probabilistic", 1, 0)
    assert int(state.fill) == 0 and not state.history.any()  # the source state is untouched
    snapshot = host.to_state()
    sift_step_cpu(host, torch.rand(6), 6, torch.tensor(1.0), "probabilistic", 1, 0)
    assert int(snapshot.fill) == 6 and int(snapshot.draws) == 1  # a snapshot does not move on
    again = HostSiftState.from_state(host.to_state())
    assert np.array_equal(again.history, host.history) and again.history is not host.history
    assert (again.pos, again.fill, again.draws, again.num_scored) == (host.pos, host.fill, 2, 12)


def test_required_kernels_are_built():
    """CI installs with a C compiler and sets NEURON_SIFT_REQUIRE_HOST_KERNELS=1: there the
    host step must be the one that runs on the CPU (tests/conftest.py fails the run earlier)."""
    if os.environ.get("NEURON_SIFT_REQUIRE_HOST_KERNELS") != "1":
        pytest.skip("NEURON_SIFT_REQUIRE_HOST_KERNELS is not 1")
    assert host_kernels_available()


def test_without_the_kernels_a_host_state_cannot_be_made(monkeypatch):
    """No silent third implementation: without the C kernels the host step refuses to
    start, and the backend runs the torch step on the CPU instead."""
    monkeypatch.setattr(cpu_step, "_host", None)
    assert not host_kernels_available()
    with pytest.raises(RuntimeError, match="host_kernels_available"):
        HostSiftState.from_state(SiftState.create(8, 0, torch.device("cpu")))


@needs_kernels
def test_unknown_mode_is_an_error():
    state = HostSiftState.from_state(SiftState.create(8, 0, torch.device("cpu")))
    with pytest.raises(ValueError, match="unknown selection mode"):
        sift_step_cpu(state, torch.rand(4), 4, torch.tensor(1.0), "greedy", 1, 0)
