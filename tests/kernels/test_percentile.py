"""percentile_rank against a plain-Python loop: mid-rank, only the first ``fill`` slots count."""

import numpy as np
import pytest
import torch

from neuron_sift.kernels import percentile_rank

BATCH_SIZES = (1, 5, 64)
HISTORY_LENGTHS = (1, 7, 100)


def reference_percentile(losses, history, fill):
    """(#{h < l} + 0.5 * #{h == l}) / fill over history[:fill]; 1.0 when fill == 0."""
    out = []
    for loss in losses:
        if fill == 0:
            out.append(1.0)
            continue
        less = 0
        equal = 0
        for j in range(fill):
            if history[j] < loss:
                less += 1
            elif history[j] == loss:
                equal += 1
        out.append((less + 0.5 * equal) / fill)
    return out


def _values(rng, n, kind):
    """float32 values of a given flavour: continuous, heavy ties (with zeros), or huge magnitudes."""
    if kind == "continuous":
        v = rng.exponential(2.0, size=n)
    elif kind == "ties":
        v = rng.integers(0, 4, size=n) * 0.5  # 0.0, 0.5, 1.0, 1.5: many ties and zeros
    elif kind == "large":
        v = rng.choice([0.0, 1.0, 1e20, 3e38, -3e38, 1e-30], size=n)
    else:  # pragma: no cover - test bug
        raise AssertionError(kind)
    return v.astype(np.float32)


def _run(losses_np, history_np, fill):
    got = percentile_rank(
        torch.from_numpy(losses_np), torch.from_numpy(history_np), torch.tensor(fill, dtype=torch.int64)
    )
    want = reference_percentile([float(x) for x in losses_np], [float(x) for x in history_np], fill)
    return got, torch.tensor(want, dtype=torch.float32)


@pytest.mark.parametrize("b", BATCH_SIZES)
@pytest.mark.parametrize("h", HISTORY_LENGTHS)
@pytest.mark.parametrize("kind", ["continuous", "ties", "large"])
def test_matches_reference_for_every_fill(b, h, kind):
    rng = np.random.default_rng(1000 * b + h)
    history = _values(rng, h, kind)
    # Draw losses partly from the history itself so exact ties with history values occur.
    losses = np.where(rng.random(b) < 0.5, rng.choice(history, size=b), _values(rng, b, kind)).astype(np.float32)
    for fill in sorted({0, 1, h // 2, h - 1, h}):
        got, want = _run(losses, history, fill)
        assert got.shape == (b,)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=f"fill={fill}")


@pytest.mark.parametrize("h", HISTORY_LENGTHS)
def test_slots_beyond_fill_are_ignored(h):
    # Garbage in the slots not yet filled must not change anything.
    rng = np.random.default_rng(h)
    fill = max(h // 2, 1)
    valid = rng.normal(size=fill).astype(np.float32)
    losses = rng.normal(size=16).astype(np.float32)
    a = np.concatenate([valid, np.full(h - fill, -1e30, dtype=np.float32)])
    b = np.concatenate([valid, np.full(h - fill, 1e30, dtype=np.float32)])
    got_a, want = _run(losses, a, fill)
    got_b, _ = _run(losses, b, fill)
    torch.testing.assert_close(got_a, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_b, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("h", HISTORY_LENGTHS)
def test_empty_history_gives_one(h):
    history = torch.randn(h)  # whatever is there is not valid yet
    losses = torch.tensor([-1e30, -1.0, 0.0, 0.5, 1e30])
    got = percentile_rank(losses, history, torch.tensor(0))
    assert torch.equal(got, torch.ones(5))


def test_ties_count_half():
    history = torch.tensor([1.0, 1.0, 1.0, 1.0])
    got = percentile_rank(torch.tensor([1.0, 1.0, 0.0, 2.0]), history, torch.tensor(4))
    assert got.tolist() == [0.5, 0.5, 0.0, 1.0]
    # One below, two equal, one above: (1 + 0.5 * 2) / 4.
    got = percentile_rank(torch.tensor([2.0]), torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor(4))
    assert got.tolist() == [0.5]


def test_zeros_against_zeros():
    # A fresh model can give all-zero losses; they sit in the middle, not at an extreme.
    got = percentile_rank(torch.zeros(5), torch.zeros(7), torch.tensor(7))
    assert torch.equal(got, torch.full((5,), 0.5))


def test_loss_dtype_is_cast_to_history_dtype():
    history = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float32)
    losses = torch.tensor([0.2, 0.25], dtype=torch.float64)
    got = percentile_rank(losses, history, torch.tensor(3))
    assert got.dtype == torch.float32
    # float64 0.2 becomes float32 0.2, equal to the stored one: a tie.
    torch.testing.assert_close(got, torch.tensor([1.5 / 3, 2.0 / 3]))


def test_inputs_not_modified():
    history = torch.randn(7)
    losses = torch.randn(5)
    h0, l0 = history.clone(), losses.clone()
    percentile_rank(losses, history, torch.tensor(4))
    assert torch.equal(history, h0) and torch.equal(losses, l0)


# --- percentile_rank_sorted / percentile_rank_auto: the sort-based formulation -----------------

from neuron_sift.kernels import percentile as percentile_module  # noqa: E402
from neuron_sift.kernels.percentile import (  # noqa: E402
    MAX_SORT_LENGTH,
    SORTED_PERCENTILE_MIN_CELLS,
    SORTED_PERCENTILE_MIN_CELLS_XLA,
    percentile_rank_auto,
    percentile_rank_sorted,
)


@pytest.mark.parametrize("b", BATCH_SIZES + (256,))
@pytest.mark.parametrize("h", HISTORY_LENGTHS + (4096,))
@pytest.mark.parametrize("kind", ["continuous", "ties", "large"])
def test_sorted_is_identical_to_pairwise(b, h, kind):
    rng = np.random.default_rng(7 * b + h)
    history = _values(rng, h, kind)
    losses = np.where(rng.random(b) < 0.5, rng.choice(history, size=b), _values(rng, b, kind)).astype(np.float32)
    for fill in sorted({0, 1, h // 2, h - 1, h}):
        args = (torch.from_numpy(losses), torch.from_numpy(history), torch.tensor(fill, dtype=torch.int64))
        want = percentile_rank(*args)
        for method in ("search", "merge"):
            got = percentile_rank_sorted(*args, method=method)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want), (method, fill)
            assert torch.equal(percentile_rank_auto(*args, method=method), want), (method, fill)


def test_sorted_handles_non_finite_losses_signed_zeros_and_garbage_slots():
    history = torch.tensor([0.0, -0.0, 1.0, 1.0, -2.0, 5.0, 1e30, -1e30, float("inf"), float("-inf")])
    losses = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1.0, 3.0, -5.0, 1e30])
    for fill in range(0, 9):  # slots from 8 on hold +-inf: garbage beyond fill, never valid
        f = torch.tensor(fill)
        want = percentile_rank(losses, history, f)
        for method in ("search", "merge"):
            assert torch.equal(percentile_rank_sorted(losses, history, f, method=method), want), (method, fill)


def test_sorted_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="method"):
        percentile_rank_sorted(torch.zeros(2), torch.zeros(4), torch.tensor(4), method="bisect")
    for method in ("bisect", None):  # below the thresholds too: the choice is checked, not just used
        with pytest.raises(ValueError, match="method"):
            percentile_rank_auto(torch.zeros(2), torch.zeros(4), torch.tensor(4), method=method)


def test_no_kernel_asks_what_device_it_runs_on():
    """The backend passes what differs by device (``method``); kernels never read the device."""
    import pathlib

    import neuron_sift.kernels as kernels

    for path in sorted(pathlib.Path(kernels.__file__).parent.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        assert "device.type" not in source and '"xla"' not in source, path.name


def test_sorted_matches_reference_loop():
    rng = np.random.default_rng(3)
    history = _values(rng, 300, "ties")
    losses = _values(rng, 40, "ties")
    got, want = _run(losses, history, 123)
    for method in ("search", "merge"):
        got_sorted = percentile_rank_sorted(
            torch.from_numpy(losses), torch.from_numpy(history), torch.tensor(123), method=method
        )
        torch.testing.assert_close(got_sorted, want, rtol=0, atol=1e-6)
        assert torch.equal(got_sorted, got)


def _auto_choice(monkeypatch, b, h, method):
    """(the formulation ``percentile_rank_auto(method=method)`` ran for B x H, equal to pairwise)."""
    calls = []
    real = percentile_module.percentile_rank_sorted

    def spy(*args, **kwargs):
        calls.append(kwargs["method"])
        return real(*args, **kwargs)

    monkeypatch.setattr(percentile_module, "percentile_rank_sorted", spy)
    history = torch.randn(h)
    losses = torch.cat([history[: b // 2], torch.randn(b - b // 2)])
    fill = torch.tensor(h - 3)
    same = torch.equal(
        percentile_rank_auto(losses, history, fill, method=method), percentile_rank(losses, history, fill)
    )
    monkeypatch.setattr(percentile_module, "percentile_rank_sorted", real)
    assert len(calls) <= 1
    return (calls[0] if calls else "pairwise"), same


def test_auto_picks_by_static_size_and_method_only(monkeypatch):
    """Each method's threshold, both sides of it, on the CPU: the choice depends on B x H
    and the caller's method, never on the device (the XLA threshold applies to "merge"
    here too). "merge" stays pairwise once B reaches MAX_SORT_LENGTH."""
    t, tx = SORTED_PERCENTILE_MIN_CELLS, SORTED_PERCENTILE_MIN_CELLS_XLA
    cases = [
        ("search", 8, t // 16, "pairwise"),
        ("search", 16, t // 16, "search"),
        ("merge", 16, t // 16, "pairwise"),  # the eager threshold is not the merge's
        ("merge", 64, (tx - 1) // 64, "pairwise"),
        ("merge", 64, -(-tx // 64), "merge"),
        ("merge", MAX_SORT_LENGTH, -(-tx // MAX_SORT_LENGTH), "pairwise"),  # B too long to sort
        ("search", MAX_SORT_LENGTH, -(-tx // MAX_SORT_LENGTH), "search"),
    ]
    for method, b, h, want in cases:
        assert (b * h >= (tx if method == "merge" else t)) == (want != "pairwise" or b >= MAX_SORT_LENGTH)
        assert _auto_choice(monkeypatch, b, h, method) == (want, True), (method, b, h)


@pytest.mark.xla
def test_sorted_on_xla_is_identical_and_has_no_fallback():
    torch_xla = pytest.importorskip(
        "torch_xla", reason="torch-xla not installed (CI installs it: pip install -e .[xla])"
    )
    import torch_xla.debug.metrics as met

    device = torch_xla.device()
    rng = np.random.default_rng(11)
    history = _values(rng, 4096, "ties")
    losses = np.where(rng.random(256) < 0.5, rng.choice(history, size=256), _values(rng, 256, "ties")).astype(
        np.float32
    )
    losses[:3] = [np.inf, -np.inf, np.nan]
    h_cpu, l_cpu = torch.from_numpy(history), torch.from_numpy(losses)
    met.clear_counters()
    for fill in (0, 1, 2048, 4096):
        want = percentile_rank(l_cpu, h_cpu, torch.tensor(fill))
        args = (l_cpu.to(device), h_cpu.to(device), torch.tensor([fill], device=device)[0])
        got = percentile_rank_sorted(*args, method="merge")
        # what the step runs on XLA at 256 x 4096 (below the merge threshold: pairwise)
        auto = percentile_rank_auto(*args, method="merge")
        torch_xla.sync()
        assert torch.equal(got.cpu(), want), fill
        assert torch.equal(auto.cpu(), want), fill
    assert not [c for c in met.counter_names() if c.startswith("aten::")]


def test_merge_chunks_long_histories_without_a_sort_longer_than_the_neuron_limit(monkeypatch):
    """H + B above 16384: the history is merged in chunks, with identical results."""
    from neuron_sift.kernels import percentile as percentile_module

    lengths = []
    real_sort = torch.sort

    def recording_sort(values, *args, **kwargs):
        dim = kwargs.get("dim", args[0] if args else -1)
        lengths.append(values.shape[dim])
        return real_sort(values, *args, **kwargs)

    monkeypatch.setattr(percentile_module.torch, "sort", recording_sort)
    rng = np.random.default_rng(5)
    for b, h in ((300, 40000), (256, 32768), (64, 16320), (64, 16321)):
        history = _values(rng, h, "ties")
        losses = np.where(rng.random(b) < 0.5, rng.choice(history, size=b), _values(rng, b, "ties")).astype(np.float32)
        for fill in (h // 3, h):
            args = (torch.from_numpy(losses), torch.from_numpy(history), torch.tensor(fill, dtype=torch.int64))
            lengths.clear()
            got = percentile_rank_sorted(*args, method="merge")
            assert lengths and max(lengths) <= percentile_module.MAX_SORT_LENGTH, (b, h, lengths)
            monkeypatch.setattr(percentile_module.torch, "sort", real_sort)
            assert torch.equal(got, percentile_rank(*args)), (b, h, fill)
            monkeypatch.setattr(percentile_module.torch, "sort", recording_sort)


def test_merge_refuses_a_batch_too_long_to_sort():
    from neuron_sift.kernels.percentile import MAX_SORT_LENGTH

    with pytest.raises(ValueError, match="fewer than 16384 losses"):
        percentile_rank_sorted(torch.zeros(MAX_SORT_LENGTH), torch.zeros(4), torch.tensor(4), method="merge")
