"""The epoch-level kernels against plain Python references: score scatter, weight gather,
percentile among all recorded scores (ties count half), the weighted mean."""

import math

import numpy as np
import pytest
import torch
from neuron_sift.kernels.scores import (
    gather_weights,
    new_score_table,
    percentile_of_all,
    record_scores,
    score_writes,
    weighted_mean,
)


def reference_percentile(scores):
    seen = [s for s in scores if not math.isnan(s)]
    out = []
    for s in scores:
        if math.isnan(s):
            out.append(1.0)
            continue
        less = sum(1 for t in seen if t < s)
        equal = sum(1 for t in seen if t == s)
        out.append((less + 0.5 * equal) / len(seen))
    return out


@pytest.mark.parametrize("method", ["search", "merge"])
@pytest.mark.parametrize("seed", range(5))
def test_percentile_matches_reference_with_ties_and_unscored(method, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    values = rng.integers(0, 6, size=n).astype(np.float32) / 2  # many ties
    values[rng.random(n) < 0.3] = np.nan
    got = percentile_of_all(torch.from_numpy(values), method=method)
    assert got.tolist() == pytest.approx(reference_percentile(values.tolist()), abs=1e-6)


@pytest.mark.parametrize("method", ["search", "merge"])
def test_percentile_all_unscored_is_one_and_single_value_is_half(method):
    assert percentile_of_all(torch.full((4,), float("nan")), method=method).tolist() == [1.0] * 4
    assert percentile_of_all(torch.tensor([2.0, float("nan")]), method=method).tolist() == [0.5, 1.0]


def test_percentile_methods_are_identical():
    rng = np.random.default_rng(9)
    values = np.where(rng.random(3000) < 0.5, rng.integers(0, 40, 3000) / 8, rng.random(3000)).astype(np.float32)
    values[rng.random(3000) < 0.2] = np.nan
    values[:4] = [np.inf, -np.inf, -0.0, 0.0]
    scores = torch.from_numpy(values)
    assert torch.equal(percentile_of_all(scores, method="search"), percentile_of_all(scores, method="merge"))


def test_percentile_negative_zero_ties_with_zero():
    for method in ("search", "merge"):
        got = percentile_of_all(torch.tensor([-0.0, 0.0, 1.0]), method=method)
        assert got.tolist() == pytest.approx([1 / 3, 1 / 3, 5 / 6])


def test_percentile_bad_method():
    for method in ("bogus", None):
        with pytest.raises(ValueError, match="method"):
            percentile_of_all(torch.zeros(3), method=method)


def test_record_scores_writes_finite_losses_and_trashes_the_rest():
    table = new_score_table(5)
    table, nonfinite = record_scores(table, torch.tensor([3, 0, 4]), torch.tensor([0.5, float("nan"), float("inf")]))
    assert int(nonfinite) == 2
    assert math.isnan(table[0]) and math.isnan(table[4])  # kept unscored
    assert table[3] == 0.5
    assert table.shape == (6,)
    table, nonfinite = record_scores(table, torch.tensor([0, 3]), torch.tensor([1.5, 2.5], dtype=torch.bfloat16))
    assert table[0] == 1.5 and table[3] == 2.5 and int(nonfinite) == 0
    assert math.isnan(table[1]) and math.isnan(table[2])


def test_score_writes_shapes_are_static():
    slots, values, nonfinite = score_writes(torch.tensor([1, 2]), torch.tensor([float("nan"), 1.0]), trash=9)
    assert slots.tolist() == [9, 2] and values.tolist() == [0.0, 1.0] and nonfinite.shape == ()


def test_gather_and_weighted_mean():
    w = torch.tensor([1.0, 2.0, 4.0])
    assert gather_weights(w, torch.tensor([2, 0])).tolist() == [4.0, 1.0]
    losses = torch.tensor([1.0, 3.0], requires_grad=True)
    out = weighted_mean(losses, torch.tensor([4.0, 1.0]))
    assert out.item() == pytest.approx((4 + 3) / 2)
    out.backward()
    assert losses.grad.tolist() == [2.0, 0.5]
    assert weighted_mean(torch.ones(2, dtype=torch.bfloat16), torch.ones(2)).dtype == torch.float32
    assert weighted_mean(torch.ones(2, dtype=torch.float64), torch.ones(2)).dtype == torch.float64
