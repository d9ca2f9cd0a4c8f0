"""The planner: epoch kinds, exact counts, systematic sampling's marginals, equal shards,
and unbiasedness of the weighted loss by simulation (a biased variant fails the same test)."""

import math

import numpy as np
import pytest
import torch

from neuron_sift import EpochSiftConfig
from neuron_sift.epoch.planner import EpochPlanner, systematic_sample


def planner(n=1000, batch=32, drop_last=False, epochs=8, world=1, rank=0, seed=5, **cfg):
    return EpochPlanner(EpochSiftConfig(**cfg), n, batch, drop_last, seed, epochs, world, rank)


def skewed_scores(n, seed=0, unscored=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.distributions.Exponential(1.0).sample((n,)) if False else -torch.log(torch.rand(n, generator=g))
    s = s**2
    if unscored:
        s[torch.randperm(n, generator=g)[:unscored]] = float("nan")
    return s


def test_epoch_kinds_warmup_sift_anneal():
    p = planner(epochs=16, warmup_epochs=2, anneal_fraction=0.125)
    assert [p.kind(e) for e in range(17)] == ["warmup"] * 2 + ["sift"] * 12 + ["anneal"] * 3
    p = planner(epochs=None, warmup_epochs=0)
    assert p.kind(0) == "sift" and p.kind(100) == "sift"


def test_full_epochs_train_everything_once_with_unit_weights():
    p = planner()
    plan = p.plan(0, skewed_scores(1000))
    assert plan.kind == "warmup" and sorted(plan.order.tolist()) == list(range(1000))
    assert torch.all(plan.weights == 1)
    unscored = p.plan(3, torch.full((1000,), float("nan")))
    assert unscored.kind == "sift-unscored" and unscored.kept == 1000


@pytest.mark.parametrize("share", [0.1, 0.3, 0.55, 0.9])
@pytest.mark.parametrize("policy", ["percentile", "below_mean"])
def test_budget_is_exact_every_epoch(policy, share):
    p = planner(policy=policy, kept_share=share)
    k = int(math.floor(share * 1000 + 0.5))
    for e in range(1, 7):
        plan = p.plan(e, skewed_scores(1000, seed=e, unscored=3))
        assert plan.kept == k == p.expected_count(e)
        assert len(set(plan.order.tolist())) == k
        assert float(plan.inclusion.sum()) == pytest.approx(k, abs=1e-3)
        assert p.rank_batches(k) == len(p.rank_batches_of(plan))


def test_unbudgeted_count_is_whole_batches_near_the_expected_count():
    p = planner(batch=32)
    scores = skewed_scores(1000)
    plan = p.plan(1, scores)
    assert plan.kept % 32 == 0
    assert abs(plan.kept - float(p._priorities(scores).sum())) <= 16
    assert all(len(b) == 32 for b in p.rank_batches_of(plan))


def test_unscored_samples_are_always_kept_with_weight_one():
    scores = skewed_scores(1000, unscored=50)
    for policy in ("percentile", "below_mean"):
        for share in (None, 0.3):
            plan = planner(policy=policy, kept_share=share).plan(2, scores)
            unscored = torch.isnan(scores).nonzero().flatten()
            assert set(unscored.tolist()) <= set(plan.order.tolist())
            assert torch.all(plan.weights[unscored] == 1)


def test_plans_are_seeded_and_differ_by_epoch():
    scores = skewed_scores(1000)
    a, b = planner(seed=1).plan(2, scores), planner(seed=1).plan(2, scores)
    assert torch.equal(a.order, b.order) and torch.equal(a.weights, b.weights)
    assert not torch.equal(a.order, planner(seed=1).plan(3, scores).order)
    assert not torch.equal(a.order, planner(seed=2).plan(2, scores).order)


def test_systematic_sampling_has_the_planned_marginals():
    torch.manual_seed(0)
    pi = torch.rand(40, dtype=torch.float64)
    pi = pi * (12 / pi.sum())
    pi = torch.clamp(pi, max=1.0)
    pi = pi * (12 / pi.sum())  # may exceed 1 slightly: cap again and accept the sum
    pi = torch.clamp(pi, max=1.0)
    k = round(float(pi.sum()))
    pi = pi * (k / pi.sum())
    pi = torch.clamp(pi, max=1.0)
    k = float(pi.sum())
    if abs(k - round(k)) > 1e-9:
        pytest.skip("construction did not give an integer sum")
    counts = torch.zeros(40, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    trials = 4000
    for _ in range(trials):
        perm = torch.randperm(40, generator=g)
        picked = systematic_sample(pi, perm, round(k), float(torch.rand((), generator=g)))
        assert len(set(picked.tolist())) == round(k)
        counts[picked] += 1
    freq = counts / trials
    se = torch.sqrt(pi * (1 - pi) / trials) + 1e-9
    assert torch.all(torch.abs(freq - pi) <= 5 * se + 1e-3)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("share", [None, 0.37])
def test_ranks_get_equal_disjoint_shares_of_one_plan(world, share):
    scores = skewed_scores(1001)
    plans = [planner(n=1001, batch=16, world=world, rank=r, kept_share=share) for r in range(world)]
    global_plans = [p.plan(2, scores) for p in plans]
    assert all(torch.equal(global_plans[0].order, g.order) for g in global_plans)
    shards = [np.concatenate(p.rank_batches_of(g)) for p, g in zip(plans, global_plans)]
    assert len({len(s) for s in shards}) == 1
    assert len({len(p.rank_batches_of(g)) for p, g in zip(plans, global_plans)}) == 1
    allids = np.concatenate(shards)
    assert len(set(allids.tolist())) == len(allids) == global_plans[0].kept
    full = [p.plan(0, scores) for p in plans]
    assert full[0].kept == 1001 - 1001 % world


def test_drop_last_cuts_whole_batches_only():
    p = planner(n=1000, batch=64, drop_last=True)
    batches = p.rank_batches_of(p.plan(0, skewed_scores(1000)))
    assert len(batches) == 15 and all(len(b) == 64 for b in batches)
    assert p.rank_batches(1000) == 15


def test_noise_guard_excludes_flagged_scored_samples():
    p = planner(noise_guard_epochs=2)
    scores = skewed_scores(1000)
    excluded = torch.zeros(1000, dtype=torch.bool)
    excluded[:100] = True
    plan = p.plan(2, scores, excluded)
    assert plan.excluded == 100
    assert not set(range(100)) & set(plan.order.tolist())


# -- unbiasedness --------------------------------------------------------------------------


def simulate(planner_, scores, epochs, biased=False):
    """Per planned epoch, the weighted mean (1/N) sum_kept w_i s_i (or, biased, the plain mean
    of the kept scores) and its standard error over epochs."""
    n = scores.shape[0]
    values = []
    for e in range(1, epochs + 1):
        plan = planner_.plan(e, scores)
        kept = scores[plan.order].double()
        if biased:
            values.append(float(kept.mean()))
        else:
            values.append(float((kept * plan.weights[plan.order].double()).sum() / n))
    values = np.array(values)
    return values.mean(), values.std(ddof=1) / math.sqrt(len(values))


CASES = [
    dict(policy="percentile", beta_value=1.0, min_keep_probability=0.05),
    dict(policy="percentile", beta_value=3.0, min_keep_probability=0.02),
    dict(policy="below_mean", prune_ratio=0.5),
    dict(policy="percentile", kept_share=0.25),
    dict(policy="below_mean", prune_ratio=0.7, kept_share=0.5),
]


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_weighted_loss_is_unbiased_and_the_unweighted_mean_is_not(cfg):
    n, epochs = 2000, 300
    scores = skewed_scores(n, seed=3)
    truth = float(scores.double().mean())
    p = planner(n=n, batch=20, epochs=None, warmup_epochs=0, seed=11, **cfg)
    mean, se = simulate(p, scores, epochs)
    assert abs(mean - truth) < 4 * se, (mean, truth, se)
    biased_mean, biased_se = simulate(p, scores, epochs, biased=True)
    assert abs(biased_mean - truth) > 4 * max(biased_se, se), (biased_mean, truth)


def test_a_clipped_weight_is_biased_low():
    n, epochs = 2000, 300
    scores = skewed_scores(n, seed=3)
    truth = float(scores.double().mean())
    p = planner(n=n, batch=20, epochs=None, warmup_epochs=0, beta_value=4.0, min_keep_probability=0.01, max_weight=2.0)
    mean, se = simulate(p, scores, epochs)
    assert mean < truth - 4 * se
