"""Resuming a sharded run at another world size: the samples re-owned, the epoch in progress
dealt out.

Why from the states alone: each rank's state of a sharded run holds the scores (and the
noise guard's streaks) of the samples it owns, its own plan and its position in it, and
ownership is a function of (sample position, world size, rank) (``planning/ownership.py``). So a
new rank takes, from every old rank's shard, the entries of the samples it owns at the new
world size; the ids trained so far in the epoch in progress are each old rank's first
``position`` batches, and the rest of every old rank's plan is dealt out to the new ranks
(``dealing.deal_rest``, as for a replicated table): nothing trained twice, nothing left
out, every rank the same number of batches.

Which samples a new rank then trains in that epoch does not follow ownership, so it hosts
the ones it does not own (guests, ``Ownership.adopt``) with their scores and weights, and
hands their scores to their owners when the epoch ends (``OwnedShares.open_scores``).
The resumed plan holds every old rank's trained ids and those done (the replicated plan's
layout): for that one epoch a rank holds ids of the epoch's size, not of its share.
"""

import copy
from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from neuron_sift.epoch.resuming.run_states import resumed_state


def _old_rank(planner: ShardedPlanner, world: int, rank: int, plan: EpochPlan | None) -> ShardedPlanner:
    """``planner`` as rank ``rank`` of ``world`` saw it: its ownership and guests."""
    old = planner.as_rank(world, rank)
    old.owner.adopt(old.guests_of(plan))
    return old


def _resumed_plan(read: list[dict[str, Any]], olds: list[ShardedPlanner], plans: list[EpochPlan]) -> EpochPlan:
    """The plan in progress as every new rank holds it: every old rank's trained ids
    (``order``) and those trained before the states were taken (``done``)."""
    first = plans[0]
    in_progress = any(bool(s["progress"]["in_progress"]) for s in read)
    if first.done is not None:  # resumed before: every old rank holds the same order and done
        order, done = [first.order.numpy().astype(np.int64)], [first.done.numpy()]
    else:
        order = [old.trained_ids(plan).numpy() for old, plan in zip(olds, plans, strict=True)]
        done = []
    if in_progress:
        for s, old, plan in zip(read, olds, plans, strict=True):
            done += old.rank_batches_of(plan)[: int(s["progress"]["position"])]
    else:
        done = order  # the epoch ended: nothing of it is left
    whole = np.concatenate(order) if order else np.empty(0, dtype=np.int64)
    return EpochPlan(
        first.epoch,
        first.kind,
        torch.from_numpy(whole.astype(np.int64)),
        first.weights,
        None,
        first.excluded,
        len(read),
        torch.from_numpy(np.concatenate(done).astype(np.int64) if done else np.empty(0, dtype=np.int64)),
    )


def reown(read: list[dict[str, Any]], planner: ShardedPlanner) -> dict[str, Any]:
    """This rank's state (``planner``'s rank of its world size) from every old rank's state of a
    sharded run (read, in rank order, checked to be one run's at one step)."""
    world = len(read)
    plans = [None if s["progress"]["plan"] is None else EpochPlan.from_state(s["progress"]["plan"]) for s in read]
    olds = [_old_rank(planner, world, r, plans[r]) for r in range(world)]
    plan = None if plans[0] is None else _resumed_plan(read, olds, [p for p in plans if p is not None])
    here = copy.copy(planner.owner)  # this rank's slots: owned, then the guests of the rest dealt here
    here.adopt(planner.guests_of(plan))

    def held_here(ids: np.ndarray) -> np.ndarray:
        return (here.owners(ids) == planner.rank) | np.isin(ids, here.guests)

    scores = torch.full((here.size,), float("nan"))
    weights = torch.ones(here.size, dtype=torch.float32)
    guard_on = planner.config.noise_guard_epochs > 0
    streak = torch.zeros(here.owned if guard_on else 0, dtype=torch.int32)
    start_on = planner.config.start_rank_correlation is not None
    previous = torch.full((here.owned if start_on else 0,), float("nan"))
    for own_part in (True, False):  # the owners' entries first, then the hosted ones (newer: trained since)
        for s, old, old_plan in zip(read, olds, plans, strict=True):
            ids = old.owner.ids() if own_part else old.owner.guests
            part = slice(0, old.owner.owned) if own_part else slice(old.owner.owned, old.owner.size)
            values = s["tables"]["scores"][part]
            take = held_here(ids) & (own_part | ~np.isnan(values.numpy()))
            slots = torch.from_numpy(here.slots(ids[take]))
            scores[slots] = values[torch.from_numpy(take)]
            if old_plan is not None:
                weights[slots] = old_plan.weights[part][torch.from_numpy(take)]
            if own_part:  # per owned entry: the noise guard's streaks and the start rule's percentiles
                mine = take & (here.owners(ids) == planner.rank)
                at, held = torch.from_numpy(here.slots(ids[mine])), torch.from_numpy(mine)
                if guard_on and s["guard"]["streak"].numel():
                    streak[at] = s["guard"]["streak"][held]
                if start_on and s["start"]["previous"].numel():
                    previous[at] = s["start"]["previous"][held]
    plan_state = None
    if plan is not None:
        w = planner.world_size
        plan_state = EpochPlan(
            plan.epoch, plan.kind, plan.order, weights, None, plan.excluded, w, plan.done
        ).state_dict()
    start = {"previous": previous, "started": bool(read[0]["start"]["started"])}  # the same on every rank
    return resumed_state(read, planner, plan_state, scores, {}, {"streak": streak}, start)
