"""The epoch policy (scores -> probabilities -> weights) and the config that selects it."""

import numpy as np
import pytest
import torch

from neuron_sift import EpochSiftConfig, SiftConfigValidationException
from neuron_sift.epoch.policy import keep_priorities, loss_weights, scale_to_count
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
    scores = torch.randperm(100_000).float()  # distinct: percentiles (i + 0.5) / n
    p = keep_priorities(scores, "percentile", beta, floor)
    assert float(p.mean()) == pytest.approx(c.expected_kept_share(), abs=1e-3)


def test_anneal_epochs():
    c = EpochSiftConfig()
    assert [c.anneal_epochs(e) for e in (None, 1, 7, 8, 12, 16)] == [0, 0, 0, 1, 1, 2]


# -- policy ------------------------------------------------------------------------------


def test_percentile_rule_and_unscored():
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, NAN])
    p = keep_priorities(scores, "percentile", beta_value=2.0, min_keep_probability=0.1)
    pct = np.array([0.125, 0.375, 0.625, 0.875])
    expected = np.maximum(0.1, pct**2).tolist() + [1.0]
    assert p.tolist() == pytest.approx(expected)


def test_below_mean_rule():
    scores = torch.tensor([1.0, 1.0, 1.0, 9.0, NAN])  # mean of scored: 3
    p = keep_priorities(scores, "below_mean", prune_ratio=0.25)
    assert p.tolist() == [0.75, 0.75, 0.75, 1.0, 1.0]
    w = loss_weights(p)
    assert w.tolist() == pytest.approx([4 / 3] * 3 + [1.0, 1.0])


def test_everything_unscored_keeps_everything():
    for policy in ("percentile", "below_mean"):
        assert keep_priorities(torch.full((3,), NAN), policy).tolist() == [1.0] * 3


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
    pi = scale_to_count(torch.from_numpy(p), torch.tensor(k, dtype=torch.float64)).numpy()
    assert pi.sum() == pytest.approx(k, abs=1e-6)
    assert np.all(pi <= 1 + 1e-12) and np.all(pi[p == 0] == 0)
    np.testing.assert_allclose(pi, reference_scale(p, k), atol=1e-6)


def test_scale_to_count_forced_and_limits():
    p = torch.tensor([0.5, 0.5, 0.25, 1.0], dtype=torch.float64)
    forced = torch.tensor([False, False, False, True])
    pi = scale_to_count(p, torch.tensor(2.0, dtype=torch.float64), forced)
    assert pi[3] == 1.0 and float(pi.sum()) == pytest.approx(2.0)
    assert pi[:3].tolist() == pytest.approx([0.4, 0.4, 0.2])
    # a count beyond the eligible samples keeps every eligible one
    assert scale_to_count(torch.tensor([0.1, 0.0, 0.3]), torch.tensor(5.0)).tolist() == [1.0, 0.0, 1.0]
    # forced samples beyond the count share it; the others get nothing
    pi = scale_to_count(torch.ones(4), torch.tensor(1.0), torch.tensor([True, True, False, False]))
    assert pi.tolist() == [0.5, 0.5, 0.0, 0.0]


def test_weights_are_inverse_probabilities_and_clip():
    pi = torch.tensor([1.0, 0.5, 0.05, 0.0])
    assert loss_weights(pi).tolist() == pytest.approx([1.0, 2.0, 20.0, 1.0])
    assert loss_weights(pi, max_weight=10.0).tolist() == pytest.approx([1.0, 2.0, 10.0, 1.0])


# -- the host (NumPy) formulation the planner uses equals the tensor one -----------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", ["percentile", "below_mean"])
def test_host_formulation_equals_tensor_functions(policy, seed):
    from neuron_sift.kernels.scores import percentile_of_all

    from neuron_sift.epoch.host_policy import keep_priorities_np, percentile_of_all_np, scale_to_count_np

    rng = np.random.default_rng(seed)
    n = 500
    s = (rng.integers(0, 50, n) / 7).astype(np.float32)  # ties
    s[rng.random(n) < 0.1] = np.nan
    s[0] = -0.0
    np.testing.assert_array_equal(percentile_of_all_np(s), percentile_of_all(torch.from_numpy(s)).numpy())
    p_np = keep_priorities_np(s, policy, 1.7, 0.03, 0.4)
    p_t = keep_priorities(torch.from_numpy(s), policy, 1.7, 0.03, 0.4).numpy()
    np.testing.assert_allclose(p_np, p_t, rtol=1e-6)
    forced = np.isnan(s)
    k = float(forced.sum() + 100)
    pi_np = scale_to_count_np(p_np, k, forced)
    pi_t = scale_to_count(
        torch.from_numpy(p_np), torch.tensor(k, dtype=torch.float64), torch.from_numpy(forced)
    ).numpy()
    np.testing.assert_allclose(pi_np, pi_t, atol=1e-9)
    assert pi_np.sum() == pytest.approx(k)
