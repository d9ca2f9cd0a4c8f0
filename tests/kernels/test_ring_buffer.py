"""ring_buffer_update against a sequential Python ring buffer and a bounded deque."""

import collections

import numpy as np
import pytest
import torch

from neuron_sift.kernels import ring_buffer_update

BATCH_SIZES = (1, 5, 64)
HISTORY_LENGTHS = (1, 7, 100)


def reference_update(history, pos, fill, values, write):
    """Write the masked values one by one, as a Python ring buffer would."""
    hist = list(history)
    h = len(hist)
    for v, w in zip(values, write):
        if w:
            hist[pos] = v
            pos = (pos + 1) % h
            fill = min(fill + 1, h)
    return hist, pos, fill


def _call(history, pos, fill, values, write):
    return ring_buffer_update(
        torch.tensor(history, dtype=torch.float32),
        torch.tensor(pos, dtype=torch.int64),
        torch.tensor(fill, dtype=torch.int64),
        torch.tensor(values, dtype=torch.float32),
        torch.tensor(write, dtype=torch.bool),
    )


@pytest.mark.parametrize("b", BATCH_SIZES)
@pytest.mark.parametrize("h", HISTORY_LENGTHS)
@pytest.mark.parametrize("write_share", [0.0, 0.3, 1.0])
def test_single_update_matches_reference(b, h, write_share):
    rng = np.random.default_rng(17 * b + h)
    for _ in range(5):
        history = rng.normal(size=h).astype(np.float32).tolist()
        pos = int(rng.integers(0, h))
        fill = int(rng.integers(0, h + 1))
        values = rng.normal(size=b).astype(np.float32).tolist()
        write = (rng.random(b) < write_share).tolist()
        new_h, new_pos, new_fill = _call(history, pos, fill, values, write)
        want_h, want_pos, want_fill = reference_update(history, pos, fill, values, write)
        assert new_h.tolist() == want_h
        assert int(new_pos) == want_pos
        assert int(new_fill) == want_fill
        assert new_h.shape == (h,) and new_pos.shape == () and new_fill.shape == ()


@pytest.mark.parametrize("h", [1, 3, 7])
def test_more_than_h_writes_at_once_keep_the_last_h(h):
    b = 3 * h + 2
    values = [float(i) for i in range(b)]
    write = [True] * b
    history = [-1.0] * h
    for pos in range(h):
        new_h, new_pos, new_fill = _call(history, pos, 0, values, write)
        want_h, want_pos, want_fill = reference_update(history, pos, 0, values, write)
        assert new_h.tolist() == want_h
        assert int(new_pos) == want_pos == (pos + b) % h
        assert int(new_fill) == want_fill == h
        # Exactly the last h written values, each once.
        assert sorted(new_h.tolist()) == values[-h:]


def test_more_than_h_writes_with_gaps():
    h = 4
    values = [float(i) for i in range(12)]
    write = [i % 3 != 1 for i in range(12)]  # 8 writes, 4 skipped
    new_h, new_pos, new_fill = _call([0.0] * h, 2, 1, values, write)
    want = reference_update([0.0] * h, 2, 1, values, write)
    assert (new_h.tolist(), int(new_pos), int(new_fill)) == want
    written = [v for v, w in zip(values, write) if w]
    assert sorted(new_h.tolist()) == written[-h:]


@pytest.mark.parametrize("b", BATCH_SIZES)
@pytest.mark.parametrize("h", HISTORY_LENGTHS)
def test_masked_rows_are_never_written(b, h):
    rng = np.random.default_rng(b * 101 + h)
    values = torch.full((b,), float("nan"))
    write = torch.from_numpy(rng.random(b) < 0.5)
    values[write] = torch.arange(int(write.sum()), dtype=torch.float32)
    history = torch.full((h,), 7.0)
    new_h, _, _ = ring_buffer_update(history, torch.tensor(0), torch.tensor(0), values, write)
    assert not torch.isnan(new_h).any()
    n = int(write.sum())
    assert set(new_h.tolist()) <= set(range(n)) | {7.0}


def test_no_write_changes_nothing():
    history = torch.tensor([1.0, 2.0, 3.0])
    new_h, new_pos, new_fill = ring_buffer_update(
        history, torch.tensor(2), torch.tensor(2), torch.tensor([9.0, 9.0]), torch.tensor([False, False])
    )
    assert torch.equal(new_h, history)
    assert int(new_pos) == 2 and int(new_fill) == 2


@pytest.mark.parametrize("b", BATCH_SIZES)
@pytest.mark.parametrize("h", HISTORY_LENGTHS)
def test_many_updates_hold_the_last_h_values_like_a_deque(b, h):
    """Starting empty, the valid slots read in ring order equal a deque(maxlen=H) of all writes."""
    rng = np.random.default_rng(b + 1000 * h)
    history = torch.zeros(h)
    pos = torch.tensor(0)
    fill = torch.tensor(0)
    dq = collections.deque(maxlen=h)
    total = 0
    for step in range(12):
        values = torch.from_numpy(rng.normal(size=b).astype(np.float32))
        share = [0.0, 0.5, 1.0][step % 3]
        write = torch.from_numpy(rng.random(b) < share)
        history, pos, fill = ring_buffer_update(history, pos, fill, values, write)
        for v, w in zip(values.tolist(), write.tolist()):
            if w:
                dq.append(v)
        total += int(write.sum())
        assert int(fill) == min(total, h)
        assert int(pos) == total % h
        f, p = int(fill), int(pos)
        if f < h:
            in_order = history[:f].tolist()  # fills from slot 0
        else:
            in_order = history[p:].tolist() + history[:p].tolist()  # oldest at pos
        assert in_order == list(dq)


def test_values_cast_to_history_dtype_and_inputs_untouched():
    history = torch.zeros(3, dtype=torch.float32)
    pos, fill = torch.tensor(1), torch.tensor(1)
    values = torch.tensor([0.1, 0.2], dtype=torch.float64)
    write = torch.tensor([True, True])
    snapshot = (history.clone(), pos.clone(), fill.clone(), values.clone(), write.clone())
    new_h, new_pos, new_fill = ring_buffer_update(history, pos, fill, values, write)
    assert new_h.dtype == torch.float32
    assert new_h.tolist() == [0.0, np.float32(0.1), np.float32(0.2)]
    assert int(new_pos) == 0 and int(new_fill) == 3
    for before, after in zip(snapshot, (history, pos, fill, values, write)):
        assert torch.equal(before, after)
