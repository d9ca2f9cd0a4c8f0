"""An epoch's plan and the settings every plan is made from (``neuron_sift.epoch.planning.plan``).
What users rely on: settings no plan could honour are refused when the planner is built,
naming the count or rank; a plan survives a checkpoint (saved, loaded with
``weights_only``) as it was, the fields of a plan resumed at another world size included,
and a plan trained where it was made keeps the layout it always had."""

import pytest
import torch

from neuron_sift import EpochSiftConfig
from neuron_sift.epoch.planning.plan import EpochPlan, PlanSettings
from tests.helpers.state_roundtrip import roundtrip

CONFIG = EpochSiftConfig(kept_share=0.5)


def test_fewer_samples_than_ranks_are_refused():
    """(Fewer samples of the sampler's than ranks: ``test_planner.py``.)"""
    with pytest.raises(ValueError, match="the dataset has 2 samples, fewer than the 3 ranks"):
        PlanSettings(CONFIG, 2, 1, False, 0, world_size=3)
    PlanSettings(CONFIG, 3, 1, False, 0, world_size=3, rank=2)  # one sample per rank: enough


@pytest.mark.parametrize("rank", [-1, 4, 5])
def test_a_rank_outside_the_world_is_refused(rank):
    with pytest.raises(ValueError, match=rf"rank must be in \[0, 4\), got {rank}"):
        PlanSettings(CONFIG, 10, 2, False, 0, world_size=4, rank=rank)


def sifted_plan(inclusion=True):
    """A sifted plan of 6 samples keeping 3 (a sharded rank's plan has no ``inclusion``)."""
    pi = torch.tensor([1.0, 0.5, 0.25, 0.5, 0.25, 0.5])
    return EpochPlan(
        epoch=2,
        kind="sift",
        order=torch.tensor([3, 0, 5], dtype=torch.int64),
        weights=1 / pi,
        inclusion=pi if inclusion else None,
        excluded=1,
    )


def same_plan(a, b):
    assert (a.epoch, a.kind, a.excluded, a.world_size, a.kept) == (b.epoch, b.kind, b.excluded, b.world_size, b.kept)
    assert torch.equal(a.order, b.order) and a.order.dtype == b.order.dtype
    assert torch.equal(a.weights, b.weights)
    assert (a.inclusion is None and b.inclusion is None) or torch.equal(a.inclusion, b.inclusion)
    assert (a.done is None and b.done is None) or torch.equal(a.done, b.done)


@pytest.mark.parametrize("inclusion", [True, False], ids=["replicated", "sharded"])
def test_a_plan_survives_a_checkpoint_in_the_layout_it_always_had(inclusion):
    plan = sifted_plan(inclusion)
    state = roundtrip(plan.state_dict())
    keys = {"epoch", "kind", "order", "weights", "excluded"} | ({"inclusion"} if inclusion else set())
    assert set(state) == keys  # no resume fields for a plan trained where it was made
    same_plan(EpochPlan.from_state(state), plan)


def test_a_plan_resumed_at_another_world_size_keeps_its_world_size_and_done_ids():
    plan = sifted_plan()
    plan.world_size, plan.done = 2, torch.tensor([3], dtype=torch.int64)
    state = roundtrip(plan.state_dict())
    assert state["world_size"] == 2 and state["done"].tolist() == [3]
    again = EpochPlan.from_state(state)
    same_plan(again, plan)


def test_a_saved_plan_is_not_changed_by_the_plan_afterwards():
    """A state held in memory (a checkpoint about to be written) is a copy, and so is a plan
    loaded from one."""
    plan = sifted_plan()
    state = plan.state_dict()
    plan.weights[0] = 7.0
    assert float(state["weights"][0]) == 1.0
    loaded = EpochPlan.from_state(state)
    state["order"][0] = 5
    assert loaded.order.tolist() == [3, 0, 5]
