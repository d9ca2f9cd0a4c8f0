"""The epoch-level kernels against plain Python references: score scatter, weight gather,
the weighted mean. (The percentile the policy ranks scores by is a host function of the
planner's, tested in tests/neuron_sift/epoch/selection/test_policy.py.)"""

import math

import pytest
import torch

from neuron_sift.kernels.scores import (
    gather_weights,
    new_score_table,
    record_scores,
    score_writes,
    weighted_mean,
)


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
