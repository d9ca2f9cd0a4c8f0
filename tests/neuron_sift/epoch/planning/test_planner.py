"""The planner: epoch kinds, exact counts, equal shards, a rank of another world size
(``as_rank``), and unbiasedness of the weighted loss by simulation (a biased variant fails
the same test). Systematic sampling's marginals: ``selection/test_draws.py``."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, SubsetRandomSampler

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader
from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.planning.planner import EpochPlanner
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, oracle_loss


def planner(n=1000, batch=32, drop_last=False, epochs=8, world=1, rank=0, seed=5, support=None, ordered=False, **cfg):
    return EpochPlanner(
        PlanSettings(
            EpochSiftConfig(**{**PRUNE_FROM_THE_START, **cfg}),
            n,
            batch,
            drop_last,
            seed,
            epochs,
            world,
            rank,
            support,
            ordered,
        )
    )


def skewed_scores(n, seed=0, unscored=0):
    g = torch.Generator().manual_seed(seed)
    s = -torch.log(torch.rand(n, generator=g))  # exponential draws, then squared: a skewed tail
    s = s**2
    if unscored:
        s[torch.randperm(n, generator=g)[:unscored]] = float("nan")
    return s


def test_epoch_kinds_warmup_sift_anneal():
    p = planner(epochs=16, warmup_epochs=2, anneal_fraction=0.125)
    assert [p.kind(e) for e in range(17)] == ["warmup"] * 2 + ["sift"] * 12 + ["anneal"] * 3
    p = planner(epochs=None, warmup_epochs=0)  # epoch 0 has no scores: a warm-up all the same
    assert p.kind(0) == "warmup" and p.kind(1) == "sift" and p.kind(100) == "sift"


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


def test_as_rank_is_the_same_run_seen_from_another_rank():
    """The resume at another world size reads each old rank's plan through ``as_rank``: it
    must be that rank's planner of the same run, with the seed the run has now (a loaded
    checkpoint's, not the one the planner was built with)."""
    p = planner(n=101, batch=8, world=2, rank=0, seed=9, kept_share=0.5)
    p.load_state_dict({**p.state_dict(), "seed": 11})
    seen = p.as_rank(3, 2)
    direct = planner(n=101, batch=8, world=3, rank=2, seed=11, kept_share=0.5)
    assert type(seen) is EpochPlanner and (seen.world_size, seen.rank, seen.seed) == (3, 2, 11)
    assert (p.world_size, p.rank, p.seed) == (2, 0, 11)  # the planner itself is unchanged
    scores = skewed_scores(101)
    plan = seen.plan(2, scores)
    assert torch.equal(plan.order, direct.plan(2, scores).order)
    assert [b.tolist() for b in seen.rank_batches_of(plan)] == [b.tolist() for b in direct.rank_batches_of(plan)]
    assert (p.budget_count(), seen.budget_count()) == (50, 51)  # in multiples of each one's world size


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


# -- the support: the samples the user's sampler yields ------------------------------------


SUPPORT = np.sort(np.random.default_rng(2).permutation(1000)[:600]).astype(np.int64)


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("share", [None, 0.3])
def test_plans_draw_only_from_the_support_and_count_from_its_size(world, share):
    scores = skewed_scores(1000, unscored=20)
    excluded = torch.zeros(1000, dtype=torch.bool)
    excluded[::7] = True  # the guard's mask is by dataset id; only its support part applies
    outside = np.setdiff1d(np.arange(1000), SUPPORT)
    for rank in range(world):
        p = planner(world=world, rank=rank, kept_share=share, noise_guard_epochs=2, support=SUPPORT)
        assert p.m == 600 and p.expected_count(0) == 600 - 600 % world
        for epoch in (0, 2, 7):  # warm-up, sifted, annealing
            plan = p.plan(epoch, scores, excluded)
            ids = plan.order.numpy()
            assert np.isin(ids, SUPPORT).all() and len(set(ids.tolist())) == len(ids)
            assert float(plan.inclusion[outside].sum()) == 0.0 and bool((plan.weights[outside] == 1).all())
            if plan.kind == "sift":
                assert plan.excluded == int(excluded[SUPPORT].sum() - (excluded & scores.isnan())[SUPPORT].sum())
                if share is not None:
                    assert plan.kept == p.budget_count() == ((round(share * 600)) // world) * world
            else:
                assert plan.kept == 600 - 600 % world
            shard = np.concatenate(p.rank_batches_of(plan))
            assert len(shard) == plan.kept // world


def test_the_support_ranks_its_own_scores_only():
    """Percentiles and the mean are of the support's scores: what samples outside it scored
    (they never train) changes nothing."""
    scores = skewed_scores(1000)
    moved = scores.clone()
    outside = torch.from_numpy(np.setdiff1d(np.arange(1000), SUPPORT))
    moved[outside] = 1e6
    for policy in ("percentile", "below_mean"):
        a = planner(policy=policy, support=SUPPORT).plan(3, scores)
        b = planner(policy=policy, support=SUPPORT).plan(3, moved)
        assert torch.equal(a.order, b.order) and torch.equal(a.weights, b.weights)


def test_a_support_of_every_sample_plans_exactly_as_no_support():
    scores = skewed_scores(1000)
    for epoch in (0, 3):
        a = planner(kept_share=0.4).plan(epoch, scores)
        b = planner(kept_share=0.4, support=np.arange(1000, dtype=np.int64)).plan(epoch, scores)
        assert torch.equal(a.order, b.order) and torch.equal(a.weights, b.weights)
        assert torch.equal(a.inclusion, b.inclusion)


def test_ordered_plans_keep_dataset_order_on_every_rank():
    scores = skewed_scores(1000)
    for rank in range(2):
        p = planner(world=2, rank=rank, kept_share=0.5, support=SUPPORT, ordered=True)
        for epoch in (0, 2):
            plan = p.plan(epoch, scores)
            assert np.all(np.diff(plan.order.numpy()) > 0)
            mine = np.concatenate(p.rank_batches_of(plan))
            assert np.all(np.diff(mine) > 0)
    unordered = planner(kept_share=0.5, support=SUPPORT).plan(2, scores).order.numpy()
    assert not np.all(np.diff(unordered) > 0)


def test_a_support_smaller_than_the_ranks_is_refused():
    with pytest.raises(ValueError, match="sampler yields 2 samples, fewer than the 3 ranks"):
        planner(world=3, support=np.array([4, 9], dtype=np.int64))


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


# -- exact lengths (the real loader) ---------------------------------------------------------


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    n=st.integers(2, 60),
    batch=st.integers(1, 9),
    drop_last=st.booleans(),
    warmup=st.integers(0, 2),
    share=st.one_of(st.none(), st.floats(0.05, 1.0)),
    anneal=st.sampled_from([0.0, 0.2, 0.5]),
    epochs=st.integers(1, 5),
    subset_seed=st.one_of(st.none(), st.integers(0, 2**16)),
)
def test_lengths_and_planned_steps_are_exact_where_documented(
    n, batch, drop_last, warmup, share, anneal, epochs, subset_seed
):
    """``planned_steps()`` before the run is the batches taken, and ``len()`` before each epoch
    is that epoch's batches, for every warm-up (0 included: the first epoch has no scores and
    trains on everything), budget, annealing, ``drop_last``, batch size and support; without a
    budget the lengths of the full epochs are exact."""
    ds = IdDataset(n)
    sampler = None
    if subset_seed is not None:
        rng = np.random.default_rng(subset_seed)
        sampler = SubsetRandomSampler(rng.permutation(n)[: rng.integers(1, n + 1)].tolist())
    dl = DataLoader(ds, batch_size=batch, drop_last=drop_last, shuffle=sampler is None, sampler=sampler)
    cfg = {**PRUNE_FROM_THE_START, "seed": 1, "warmup_epochs": warmup, "kept_share": share, "anneal_fraction": anneal}
    try:
        loader = EpochSiftingDataloader(cfg, dl, num_epochs=epochs)
    except (
        ValueError
    ) as exc:  # some epoch would yield no batch: refused (tests/neuron_sift/epoch/planning/test_planned_counts.py)
        m = n if sampler is None else len(sampler)
        budget = None if share is None else max(1, math.floor(share * m + 0.5))
        assert drop_last and "train nothing" in str(exc), exc
        assert m < batch or (budget is not None and budget < batch), (m, budget, batch)
        return
    planned, taken = loader.planned_steps(), 0
    for _ in range(epochs):
        before, kind = len(loader), loader.planner.kind(loader.epoch)
        got = 0
        for x, _y in loader:
            loader.weighted_loss(oracle_loss(x))
            got += 1
        if share is not None or kind != "sift":
            assert before == got, (loader.plan.kind, before, got)
        taken += got
    if share is not None:
        assert planned == taken
