"""What a full epoch (warm-up, annealing, or a sifted epoch without scores) trains under data
parallelism, as docs/epoch-sifting.md and docs/sharded-score-table.md state it: every rank the same
number of samples, so ``N mod W`` of the ``N`` samples are left out, a new draw each epoch.
Under the replicated table they are the last of the epoch's random order; under the sharded
table every rank trains ``N // W`` of the samples it owns, so each rank owning one sample more
than the others leaves out one of its own. Ranks are threads (``thread_ranks.py``)."""

import pytest
import torch

from neuron_sift import EpochSiftConfig
from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from tests.neuron_sift.epoch.thread_ranks import run_ranks

EPOCHS = 8  # epoch 0 warms up, epoch 7 anneals, 1 to 6 are sifted epochs without scores: all full


def full_epochs(planner) -> list:
    unscored = torch.full((planner.table_size,), float("nan"))
    plans = [planner.plan(epoch, unscored) for epoch in range(EPOCHS)]
    assert [p.kind for p in plans] == ["warmup"] + ["sift-unscored"] * 6 + ["anneal"]
    return plans


@pytest.mark.parametrize(("n", "world"), [(10, 3), (23, 4), (12, 3), (7, 2)])
def test_a_sharded_full_epoch_leaves_out_one_sample_of_each_rank_owning_one_more(n, world):
    def rank(ranks):
        config = EpochSiftConfig(score_table="sharded")
        planner = ShardedPlanner(PlanSettings(config, n, 4, False, 5, EPOCHS, world, ranks.rank), ranks)
        trained = [[int(i) for b in planner.rank_batches_of(p) for i in b] for p in full_epochs(planner)]
        return set(planner.owner.ids().tolist()), trained

    out = run_ranks(world, rank)
    for epoch in range(EPOCHS):
        everyone = [i for _, trained in out for i in trained[epoch]]
        assert len(everyone) == len(set(everyone)) == n - n % world  # each once, N mod W left out
        for r, (owned, trained) in enumerate(out):
            assert len(trained[epoch]) == n // world and set(trained[epoch]) <= owned
            assert len(owned - set(trained[epoch])) == (1 if r < n % world else 0)  # ranks 0 .. N mod W - 1
    for owned, trained in out[: n % world]:  # the left-out sample is drawn anew each epoch
        assert len({min(owned - set(t)) for t in trained}) > 1


@pytest.mark.parametrize(("n", "world"), [(10, 3), (23, 4)])
def test_a_replicated_full_epoch_leaves_out_n_mod_w_samples_drawn_anew_each_epoch(n, world):
    config = EpochSiftConfig()
    planners = [EpochPlanner(PlanSettings(config, n, 4, False, 5, EPOCHS, world, r)) for r in range(world)]
    left_out = []
    for plan in full_epochs(planners[0]):
        everyone = [int(i) for p in planners for b in p.rank_batches_of(plan) for i in b]
        assert len(everyone) == len(set(everyone)) == n - n % world
        assert all(sum(len(b) for b in p.rank_batches_of(plan)) == n // world for p in planners)
        left_out.append(tuple(sorted(set(range(n)) - set(everyone))))
    assert len(set(left_out)) > 1  # a new draw each epoch
