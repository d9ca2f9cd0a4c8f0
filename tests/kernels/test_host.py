"""The C kernels of the CPU step (kernels/_host.c) against the torch kernels they replace.

Skipped only where the extension was not built; CI sets NEURON_SIFT_REQUIRE_HOST_KERNELS=1,
which turns a missing build into an error (tests/conftest.py).
"""

import numpy as np
import pytest
import torch

from neuron_sift.kernels import percentile_rank, ring_buffer_update, uniform_from_counter

_host = pytest.importorskip("neuron_sift.kernels._host", reason="C kernels not built (no compiler at install)")


def values(rng, n, kind):
    if kind == "ties":
        return (rng.integers(0, 5, n) / 4).astype(np.float32)
    if kind == "signed":  # negative losses, -0.0 and 0.0 side by side
        x = rng.normal(size=n).astype(np.float32)
        x[rng.random(n) < 0.1] = -0.0
        x[rng.random(n) < 0.1] = 0.0
        return x
    return rng.random(n).astype(np.float32) * 3


def sorted_copy(history, fill):
    out = np.empty_like(history)
    _host.sort(history, fill, out)
    return out


@pytest.mark.parametrize("kind", ["uniform", "ties", "signed"])
@pytest.mark.parametrize("fill", [0, 1, 7, 300, 512])
def test_rank_equals_the_torch_percentile(kind, fill):
    rng = np.random.default_rng(fill)
    history = values(rng, 512, kind)
    losses = np.concatenate([values(rng, 60, kind), history[:4]])  # some equal to history entries
    losses[3] = np.nan
    losses[5] = np.inf
    out = np.full(70, -1.0, dtype=np.float32)
    nonfinite = _host.rank(losses, 64, sorted_copy(history, fill), fill, out)
    safe = torch.from_numpy(np.where(np.isfinite(losses), losses, 0.0).astype(np.float32))
    want = percentile_rank(safe, torch.from_numpy(history), torch.tensor(fill))
    assert nonfinite == 2
    assert torch.equal(torch.from_numpy(out[:64]), want)
    assert (out[64:] == 1.0).all()  # padding rows


@pytest.mark.parametrize("kind", ["uniform", "ties", "signed"])
@pytest.mark.parametrize("h,batch", [(50, 16), (50, 64), (8, 3), (1, 4), (300, 300)])
def test_record_equals_the_ring_buffer_and_keeps_the_order(kind, h, batch):
    rng = np.random.default_rng(h * 1000 + batch)
    history = np.zeros(h, dtype=np.float32)
    ordered = np.zeros(h, dtype=np.float32)
    ref = (torch.zeros(h), torch.tensor(0), torch.tensor(0))
    pos = fill = 0
    for step in range(12):
        v = values(rng, batch, kind)
        v[rng.random(batch) < 0.1] = np.nan
        mask = rng.random(batch) < 0.8 if step % 2 else None
        n = batch - (step % 3)
        pos, fill = _host.record(v, mask, n, history, ordered, pos, fill)
        write = torch.isfinite(torch.from_numpy(v)) & (torch.arange(batch) < n)
        if mask is not None:
            write &= torch.from_numpy(mask)
        safe = torch.from_numpy(np.where(np.isfinite(v), v, 0.0).astype(np.float32))
        ref = ring_buffer_update(*ref, safe, write)
        assert torch.equal(torch.from_numpy(history), ref[0])
        assert (pos, fill) == (int(ref[1]), int(ref[2]))
        # the kept order is history[:fill] sorted (as floats; -0.0 and 0.0 may sit either way)
        assert np.array_equal(ordered[:fill], np.sort(history[:fill]))
        assert np.array_equal(np.sort(ordered[:fill].view(np.uint32)), np.sort(history[:fill].view(np.uint32)))


def test_record_of_nothing_changes_nothing():
    history = np.arange(4, dtype=np.float32)
    ordered = history.copy()
    nan = np.full(3, np.nan, dtype=np.float32)
    assert _host.record(nan, None, 3, history, ordered, 2, 3) == (2, 3)
    assert _host.record(nan, None, 0, history, ordered, 2, 3) == (2, 3)
    assert np.array_equal(history, np.arange(4))


def test_sort_matches_numpy():
    rng = np.random.default_rng(0)
    for kind in ("uniform", "ties", "signed"):
        x = values(rng, 1000, kind)
        assert np.array_equal(sorted_copy(x, 1000), np.sort(x))


@pytest.mark.parametrize("n", [1, 5, 256, 1000])
@pytest.mark.parametrize("seed,counter", [(0, 0), (12345, 7), (2**31 - 2, 2**31 - 1), (3, 2**40 + 9)])
def test_uniforms_equal_the_torch_hash(n, seed, counter):
    out = np.empty(n, dtype=np.float32)
    _host.uniforms(seed, counter, out)
    assert torch.equal(torch.from_numpy(out), uniform_from_counter(torch.tensor(seed), torch.tensor(counter), n))


def test_bad_arguments_are_clear_errors():
    f32 = np.zeros(8, dtype=np.float32)
    with pytest.raises(TypeError, match="format 'f'"):
        _host.rank(np.zeros(8), 8, f32, 0, f32.copy())  # float64 losses
    with pytest.raises((TypeError, BufferError, ValueError)):
        _host.rank(np.zeros(16, dtype=np.float32)[::2], 8, f32, 0, f32.copy())  # not contiguous
    with pytest.raises(ValueError, match="out of range"):
        _host.rank(f32, 9, f32, 0, f32.copy())
    with pytest.raises(ValueError, match="out of range"):
        _host.record(f32, None, 8, f32.copy(), f32.copy(), 8, 0)  # pos outside the buffer
    with pytest.raises(ValueError, match=">= 0"):
        _host.uniforms(-1, 0, f32)
    history = np.arange(8, dtype=np.float32)
    wrong_order = np.zeros(8, dtype=np.float32)  # not the sorted history
    with pytest.raises(RuntimeError, match="does not match"):
        _host.record(np.ones(2, dtype=np.float32), None, 2, history, wrong_order, 0, 8)


@pytest.mark.parametrize("kind", ["uniform", "ties", "signed"])
def test_rank_and_record_is_rank_then_record(kind):
    rng = np.random.default_rng(3)
    h = 40
    a_hist, a_ord = np.zeros(h, np.float32), np.zeros(h, np.float32)
    b_hist, b_ord = np.zeros(h, np.float32), np.zeros(h, np.float32)
    a_pos = a_fill = b_pos = b_fill = 0
    for step in range(10):
        losses = values(rng, 16, kind)
        losses[rng.random(16) < 0.1] = np.inf
        n_valid = 16 - step % 4
        out_a, out_b = np.empty(16, np.float32), np.empty(16, np.float32)
        nonfinite_a = _host.rank(losses, n_valid, a_ord, a_fill, out_a)
        a_pos, a_fill = _host.record(losses, None, n_valid, a_hist, a_ord, a_pos, a_fill)
        nonfinite_b, b_pos, b_fill = _host.rank_and_record(losses, n_valid, b_hist, b_ord, b_pos, b_fill, out_b)
        assert nonfinite_a == nonfinite_b == int((~np.isfinite(losses[:n_valid])).sum())
        assert np.array_equal(out_a, out_b) and np.array_equal(a_hist, b_hist) and np.array_equal(a_ord, b_ord)
        assert (a_pos, a_fill) == (b_pos, b_fill)


@pytest.mark.parametrize("n_valid", [0, 1, 100, 128])
def test_draw_keep_is_the_uniform_draw(n_valid):
    rng = np.random.default_rng(n_valid)
    p = rng.random(128).astype(np.float32)
    losses = rng.random(128).astype(np.float32)
    losses[[3, 50]] = [np.nan, -np.inf]
    u = np.empty(128, np.float32)
    _host.uniforms(77, 5, u)
    want = np.flatnonzero((u < p) | ~np.isfinite(losses))
    want = want[want < n_valid]
    out = np.full(128, -1, dtype=np.int64)
    count = _host.draw_keep(77, 5, p, losses, n_valid, out)
    assert count == len(want) and np.array_equal(out[:count], want)
    with pytest.raises(TypeError, match="int64"):
        _host.draw_keep(77, 5, p, losses, n_valid, np.empty(128, np.int32))
