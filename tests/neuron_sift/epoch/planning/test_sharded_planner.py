"""The sharded planner (``score_table="sharded"``): each rank owns and plans its own samples
from a merged summary. Ranks run as threads (``thread_ranks.py``) so that thousands of plans
stay fast: ownership, agreement with the exact planner (identical where the summary is
exact, within the stated rank error otherwise), exact counts and equal shares, another
rank's planner of the same run (``as_rank``), and the unbiasedness of the weighted loss by simulation on the sharded path."""

import math

import numpy as np
import pytest
import torch

from neuron_sift import EpochSiftConfig
from neuron_sift.epoch.planning.ownership import Ownership
from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from neuron_sift.epoch.selection.policies import keep_priorities
from neuron_sift.epoch.selection.quantiles import KNOTS
from neuron_sift.shared.ranks import RankGroup
from tests.neuron_sift.epoch.planning.test_planner import skewed_scores
from tests.neuron_sift.epoch.thread_ranks import run_ranks


def sharded(ranks, n, batch=8, seed=5, support=None, knots=KNOTS, drop_last=False, **cfg):
    config = EpochSiftConfig(score_table="sharded", **cfg)
    settings = PlanSettings(config, n, batch, drop_last, seed, 8, ranks.world_size, ranks.rank, support)
    return ShardedPlanner(settings, ranks, knots)


def owned_scores(planner, scores):
    return scores[torch.from_numpy(planner.owner.ids())]


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("subset", [False, True])
def test_every_sample_has_one_owner_and_one_slot(world, subset):
    n = 50
    support = np.sort(np.random.default_rng(0).choice(n, 31, replace=False)) if subset else None
    owners = [Ownership(n, support, world, r) for r in range(world)]
    everyone = np.concatenate([o.ids() for o in owners])
    expected = support if subset else np.arange(n)
    assert sorted(everyone.tolist()) == sorted(expected.tolist())  # each sample owned once
    for r, o in enumerate(owners):
        assert o.slots(o.ids()).tolist() == list(range(o.owned))  # slots 0 .. owned-1, in order
        assert (o.owners(o.ids()) == r).all()
    assert max(o.owned for o in owners) - min(o.owned for o in owners) <= 1


def test_a_foreign_or_unknown_id_is_refused_and_guests_take_the_slots_after():
    o = Ownership(10, None, 3, 1)  # owns 1, 4, 7
    with pytest.raises(ValueError, match="owned by rank 2"):
        o.slots(np.array([4, 2]))
    with pytest.raises(ValueError, match="not one the sampler yields"):
        o.slots(np.array([10]))
    o.adopt(np.array([6, 0]))
    assert o.size == 5 and o.slots(np.array([7, 0, 6, 1])).tolist() == [2, 3, 4, 0]
    with pytest.raises(AssertionError):
        o.adopt(np.array([4]))  # its own sample is never a guest
    subset = Ownership(10, np.array([2, 3, 5, 8]), 2, 0)  # owns 2 and 5
    with pytest.raises(ValueError, match="not one the sampler yields"):
        subset.slots(np.array([4]))
    assert subset.slots(np.array([5, 2])).tolist() == [1, 0]


def test_as_rank_is_that_ranks_sharded_planner_of_the_same_run():
    """The resume at another world size reads each old rank's shard through ``as_rank``: that
    rank's ownership and slots, the run's seed and summary size, no guests of this rank's."""
    here = sharded(RankGroup(False, torch.device("cpu")), 11, knots=16, support=np.arange(1, 11))
    here.load_state_dict({**here.state_dict(), "seed": 12})
    seen = here.as_rank(3, 1)
    assert type(seen) is ShardedPlanner and (seen.world_size, seen.rank, seen.seed, seen.knots) == (3, 1, 12, 16)
    assert seen.owner.ids().tolist() == [2, 5, 8]  # positions 1, 4, 7 of the sampler's samples 1 .. 10
    assert seen.owner.guests.size == 0 and seen.table_size == 3
    assert (here.world_size, here.rank, here.owner.owned) == (1, 0, 10)  # the planner itself is unchanged


@pytest.mark.parametrize("policy", ["percentile", "below_mean"])
@pytest.mark.parametrize("share", [None, 0.3])
def test_one_rank_with_an_exact_summary_keeps_the_exact_planners_probabilities(policy, share):
    n = 600  # fewer distinct scores than knots: the summary is exact
    scores = skewed_scores(n, seed=3, unscored=5)
    exact = EpochPlanner(PlanSettings(EpochSiftConfig(policy=policy, kept_share=share), n, 8, False, 5, 8)).plan(
        2, scores
    )
    (plan, planner) = run_ranks(
        1, lambda r: (lambda p: (p.plan(2, scores), p))(sharded(r, n, policy=policy, kept_share=share))
    )[0]
    assert planner.last_summary.rank_error == 0.0
    assert plan.kept == exact.kept
    np.testing.assert_allclose(1.0 / plan.weights.numpy(), exact.inclusion.numpy(), rtol=1e-6)


@pytest.mark.parametrize("world", [2, 3])
def test_priorities_agree_with_the_exact_percentiles_within_the_stated_rank_error(world):
    n, knots = 20_000, 64  # far more distinct scores than knots: the summary is approximate
    scores = skewed_scores(n, seed=1, unscored=40)
    exact = keep_priorities(scores.numpy(), "percentile")

    def rank(r):
        p = sharded(r, n, knots=knots, kept_share=0.4)
        plan = p.plan(3, owned_scores(p, scores))
        mine = keep_priorities(owned_scores(p, scores).numpy(), "percentile", summary=p.last_summary)
        return p, plan, mine

    out = run_ranks(world, rank)
    error = out[0][0].last_summary.rank_error
    assert 0 < error < world / knots  # each part's error below 1 / knots
    for p, plan, mine in out:
        assert np.abs(mine - exact[p.owner.ids()]).max() <= error + 1e-6
        assert plan.kept == (round(0.4 * n) // world)  # exact, and the same on every rank
        assert (p.owner.owners(plan.order.numpy()) == p.rank).all()  # a rank plans only what it owns
    assert len({int(i) for _, plan, _ in out for i in plan.order}) == (round(0.4 * n) // world) * world


def test_a_budget_too_large_for_some_rank_is_cut_to_what_every_rank_can_keep():
    n = 40
    scores = skewed_scores(n, seed=2)

    def rank(r):
        p = sharded(r, n, kept_share=0.9, noise_guard_epochs=1)
        excluded = torch.zeros(p.table_size, dtype=torch.bool)
        if r.rank == 0:
            excluded[:12] = True  # rank 0 may keep only 8 of its 20
        return p.plan(3, owned_scores(p, scores), excluded)

    plans = run_ranks(2, rank)
    assert [p.kept for p in plans] == [8, 8] and plans[0].excluded == 12


def test_unscored_everywhere_trains_everything_and_full_epochs_split_equally():
    n = 23

    def rank(r):
        p = sharded(r, n)
        return (
            p,
            p.plan(0, torch.full((p.table_size,), float("nan"))),
            p.plan(4, torch.full((p.table_size,), float("nan"))),
        )

    out = run_ranks(3, rank)
    for _, warm, unscored in out:
        assert warm.kind == "warmup" and unscored.kind == "sift-unscored"
        assert warm.kept == unscored.kept == n // 3 and torch.all(warm.weights == 1)
    assert len({int(i) for _, warm, _ in out for i in warm.order}) == (n // 3) * 3


@pytest.mark.parametrize("policy", ["percentile", "below_mean"])
def test_the_weighted_loss_is_unbiased_on_the_sharded_path(policy):
    """Each sample's empirical keep frequency matches its ``pi`` and the weighted sum of
    losses over the kept samples averages to the full sum (Horvitz-Thompson), over many
    seeds of three ranks' stratified draws."""
    n, world, trials = 90, 3, 1500
    scores = skewed_scores(n, seed=4)
    losses = scores.numpy().astype(np.float64)

    def rank(r):
        p = sharded(r, n, kept_share=0.3, policy=policy)
        mine = owned_scores(p, scores)
        kept_count = np.zeros(p.table_size)
        estimates = []
        for t in range(trials):
            p.seed = 1000 + t
            plan = p.plan(2, mine)
            slots = p.slots(plan.order.numpy().astype(np.int64))
            kept_count[slots] += 1
            estimates.append(float((plan.weights.numpy()[slots] * losses[plan.order.numpy()]).sum()))
        return p, 1.0 / plan.weights.numpy(), kept_count / trials, np.array(estimates)

    out = run_ranks(world, rank)
    total = np.zeros(trials)
    for _, pi, freq, estimates in out:
        sd = np.sqrt(pi * (1 - pi) / trials)
        assert (np.abs(freq - pi) <= 4.5 * sd + 1e-9).all()
        total += estimates
    assert math.isclose(total.mean(), losses.sum(), rel_tol=0.02)


def test_a_rank_holds_only_its_share():
    n, world = 1003, 4

    def rank(r):
        p = sharded(r, n, kept_share=0.5)
        plan = p.plan(2, owned_scores(p, skewed_scores(n, seed=5)))
        return p, plan

    for p, plan in run_ranks(world, rank):
        assert p.table_size == len(range(p.rank, n, world))
        assert plan.weights.shape[0] == p.table_size and plan.inclusion is None
        assert plan.order.dtype == torch.int32 and plan.kept == (round(0.5 * n) // world)


@pytest.mark.parametrize("policy", ["percentile", "below_mean"])
def test_priorities_computed_in_chunks_give_the_same_plan(monkeypatch, policy):
    import neuron_sift.epoch.planning.sharded_planner as sharded_module

    n = 500
    scores = skewed_scores(n, seed=6, unscored=4)

    def plan_of(r):
        p = sharded(r, n, kept_share=0.3, policy=policy, knots=32)
        return p.plan(2, owned_scores(p, scores))

    whole = run_ranks(2, plan_of)
    monkeypatch.setattr(sharded_module, "CHUNK", 7)  # chunk edges fall inside each rank's share
    chunked = run_ranks(2, plan_of)
    for a, b in zip(whole, chunked, strict=True):
        assert torch.equal(a.order, b.order) and torch.equal(a.weights, b.weights)
