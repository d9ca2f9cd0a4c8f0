"""The epoch policy (scores -> probabilities -> weights), the functions the planner runs, and
the config that selects it."""

import math

import numpy as np
import pytest
import torch

from neuron_sift import EpochSiftConfig, SiftConfigValidationException
from neuron_sift.epoch.selection.policies import keep_priorities
from neuron_sift.epoch.selection.policy import loss_weights, percentile_of_all, scale_to_count
from neuron_sift.sift_config.epoch_config import coerce_epoch_config

NAN = float("nan")


# -- config ------------------------------------------------------------------------------


def test_defaults_and_dict():
    c = EpochSiftConfig()
    assert (c.policy, c.beta_value, c.min_keep_probability, c.warmup_epochs, c.anneal_fraction) == (
        "percentile",
        1.0,
        0.05,
        1,
        0.125,
    )
    assert c.kept_share is None and c.noise_guard_epochs == 0
    d = coerce_epoch_config({"policy": "below_mean", "prune_ratio": 0.3, "kept_share": 0.6})
    assert d.policy == "below_mean" and d.prune_ratio == 0.3 and d.kept_share == 0.6


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"policy": "topk"}, "policy"),
        ({"beta_value": 0}, "beta_value"),
        ({"beta_value": float("inf")}, "beta_value"),
        ({"beta_value": True}, "beta_value"),
        ({"min_keep_probability": 0.0}, "min_keep_probability"),
        ({"min_keep_probability": 1.5}, "min_keep_probability"),
        ({"prune_ratio": 1.0}, "prune_ratio"),
        ({"kept_share": 0.0}, "kept_share"),
        ({"kept_share": 1.2}, "kept_share"),
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"warmup_epochs": 1.5}, "warmup_epochs"),
        ({"anneal_fraction": 1.1}, "anneal_fraction"),
        ({"max_weight": 0.5}, "max_weight"),
        ({"seed": -3}, "seed"),
        ({"noise_guard_epochs": -1}, "noise_guard_epochs"),
        ({"noise_guard_quantile": 1.0}, "noise_guard_quantile"),
    ],
)
def test_bad_values_name_the_key(kwargs, key):
    with pytest.raises(SiftConfigValidationException, match=f"EpochSiftConfig.{key}"):
        EpochSiftConfig(**kwargs)


def test_bad_dicts_and_types():
    with pytest.raises(SiftConfigValidationException, match="unknown key"):
        coerce_epoch_config({"beta": 1.0})
    with pytest.raises(SiftConfigValidationException, match="EpochSiftConfig or a dict"):
        coerce_epoch_config(3)


@pytest.mark.parametrize("beta, floor", [(1.0, 0.05), (2.0, 0.05), (0.5, 0.2), (3.0, 0.01)])
def test_expected_share_formula_matches_the_policy(beta, floor):
    c = EpochSiftConfig(beta_value=beta, min_keep_probability=floor)
    scores = np.random.default_rng(0).permutation(100_000).astype(np.float32)  # distinct: (i + 0.5) / n
    p = keep_priorities(scores, "percentile", beta, floor)
    assert float(p.mean()) == pytest.approx(c.expected_kept_share(), abs=1e-3)


def test_anneal_epochs():
    c = EpochSiftConfig()
    assert [c.anneal_epochs(e) for e in (None, 1, 7, 8, 12, 16)] == [0, 0, 0, 1, 1, 2]


# -- policy ------------------------------------------------------------------------------


def test_percentile_rule_and_unscored():
    scores = np.array([1.0, 2.0, 3.0, 4.0, NAN])
    p = keep_priorities(scores, "percentile", beta_value=2.0, min_keep_probability=0.1)
    pct = np.array([0.125, 0.375, 0.625, 0.875])
    expected = np.maximum(0.1, pct**2).tolist() + [1.0]
    assert p.tolist() == pytest.approx(expected)


@pytest.mark.parametrize("beta", [1.0, 0.5, 1.7, 3.0])
def test_percentile_priorities_are_one_rounding_of_the_power_on_every_numpy(beta):
    """``max(min_keep_probability, percentile ** beta)`` rounded once to float32, so the same
    scores plan the same epochs on every stack: NumPy 1.26's AVX-512 float32 power is an ulp
    off (even ``pct ** 1 != pct``), NumPy 2's is not, and plans differed between the two."""
    rng = np.random.default_rng(0)
    for n in (380, 1999, 4999):  # sizes whose percentiles NumPy 1.26's power misrounds at beta 1
        s = (rng.standard_normal(n) * 1e6).astype(np.float32)
        pct = percentile_of_all(s)
        p = keep_priorities(s, "percentile", beta_value=beta, min_keep_probability=0.05)
        # The C library's double-precision power, then one rounding: the correctly rounded value.
        expected = np.array([max(0.05, math.pow(float(q), beta)) for q in pct], dtype=np.float32)
        assert p.dtype == np.float32 and np.array_equal(p, expected)
        if beta == 1.0:
            assert np.array_equal(p, np.maximum(pct, np.float32(0.05)))  # the percentile itself


def test_below_mean_rule():
    scores = np.array([1.0, 1.0, 1.0, 9.0, NAN])  # mean of scored: 3
    p = keep_priorities(scores, "below_mean", prune_ratio=0.25)
    assert p.tolist() == [0.75, 0.75, 0.75, 1.0, 1.0]
    w = loss_weights(torch.from_numpy(p))
    assert w.tolist() == pytest.approx([4 / 3] * 3 + [1.0, 1.0])


def test_everything_unscored_keeps_everything():
    for policy in ("percentile", "below_mean"):
        assert keep_priorities(np.full(3, NAN), policy).tolist() == [1.0] * 3
    with pytest.raises(ValueError, match="unknown policy"):
        keep_priorities(np.zeros(3), "topk")


def reference_scale(p, k):
    """Bisection on c: sum(min(1, c * p)) = k."""
    lo, hi = 0.0, 1e12
    for _ in range(300):
        mid = (lo + hi) / 2
        if np.minimum(1.0, mid * p).sum() < k:
            lo = mid
        else:
            hi = mid
    return np.minimum(1.0, hi * p)


@pytest.mark.parametrize("seed", range(6))
def test_scale_to_count_matches_bisection(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    p = rng.random(n) ** 3
    p[rng.random(n) < 0.1] = 0.0
    k = float(rng.integers(1, max(2, int((p > 0).sum()))))
    pi = scale_to_count(p, k)
    assert pi.sum() == pytest.approx(k, abs=1e-6)
    assert np.all(pi <= 1 + 1e-12) and np.all(pi[p == 0] == 0)
    np.testing.assert_allclose(pi, reference_scale(p, k), atol=1e-6)


def test_scale_to_count_forced_and_limits():
    p = np.array([0.5, 0.5, 0.25, 1.0])
    forced = np.array([False, False, False, True])
    pi = scale_to_count(p, 2.0, forced)
    assert pi[3] == 1.0 and float(pi.sum()) == pytest.approx(2.0)
    assert pi[:3].tolist() == pytest.approx([0.4, 0.4, 0.2])
    # a count beyond the eligible samples keeps every eligible one
    assert scale_to_count(np.array([0.1, 0.0, 0.3]), 5.0).tolist() == [1.0, 0.0, 1.0]
    # forced samples beyond the count share it; the others get nothing
    pi = scale_to_count(np.ones(4), 1.0, np.array([True, True, False, False]))
    assert pi.tolist() == [0.5, 0.5, 0.0, 0.0]


def test_weights_are_inverse_probabilities_and_clip():
    pi = torch.tensor([1.0, 0.5, 0.05, 0.0])
    assert loss_weights(pi).tolist() == pytest.approx([1.0, 2.0, 20.0, 1.0])
    assert loss_weights(pi, max_weight=10.0).tolist() == pytest.approx([1.0, 2.0, 10.0, 1.0])


# -- the percentile (moved from tests/kernels/test_scores.py with the function) ----------


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


@pytest.mark.parametrize("seed", range(5))
def test_percentile_matches_reference_with_ties_and_unscored(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    values = rng.integers(0, 6, size=n).astype(np.float32) / 2  # many ties
    values[rng.random(n) < 0.3] = np.nan
    assert percentile_of_all(values).tolist() == pytest.approx(reference_percentile(values.tolist()), abs=1e-6)


def test_percentile_all_unscored_is_one_and_single_value_is_half():
    assert percentile_of_all(np.full(4, NAN)).tolist() == [1.0] * 4
    assert percentile_of_all(np.array([2.0, NAN])).tolist() == [0.5, 1.0]


def test_percentile_negative_zero_and_infinities_tie_as_values():
    assert percentile_of_all(np.array([-0.0, 0.0, 1.0])).tolist() == pytest.approx([1 / 3, 1 / 3, 5 / 6])
    values = np.array([np.inf, -np.inf, -0.0, 0.0, 2.5, NAN, np.inf], dtype=np.float32)
    assert percentile_of_all(values).tolist() == pytest.approx(reference_percentile(values.tolist()), abs=1e-6)


# -- properties of the functions the planner runs ---------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", ["percentile", "below_mean"])
def test_priorities_are_monotone_in_the_score_and_within_bounds(policy, seed):
    """A higher loss never lowers a sample's keep probability; every priority is a probability."""
    rng = np.random.default_rng(seed)
    s = (rng.integers(0, 50, 500) / 7).astype(np.float32)  # ties
    s[rng.random(500) < 0.1] = np.nan
    s[0] = -0.0
    p = keep_priorities(s, policy, 1.7, 0.03, 0.4)
    assert p.dtype == np.float32 and np.all((p > 0) & (p <= 1)) and np.all(p[np.isnan(s)] == 1)
    seen = ~np.isnan(s)
    order = np.argsort(s[seen], kind="stable")
    assert np.all(np.diff(p[seen][order]) >= 0)


@pytest.mark.parametrize("seed", range(4))
def test_scale_to_count_is_exact_keeps_the_forced_and_preserves_the_order(seed):
    rng = np.random.default_rng(seed)
    n = 500
    p = keep_priorities(rng.random(n).astype(np.float32), "percentile", 1.7, 0.03)
    forced = rng.random(n) < 0.1
    k = float(forced.sum() + 100)
    pi = scale_to_count(p, k, forced)
    assert pi.sum() == pytest.approx(k) and np.all(pi[forced] == 1) and np.all((pi >= 0) & (pi <= 1))
    free = ~forced
    order = np.argsort(p[free], kind="stable")
    assert np.all(np.diff(pi[free][order]) >= -1e-12)  # one common factor: the policy's ranking stays
