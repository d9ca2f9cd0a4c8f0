"""Resuming a replicated run at another world size: every rank's checkpoint of a run at ``W``
ranks made into this rank's state of the same run at ``W'`` ranks (a sharded run:
``sharded_reshard.py``).

Why it can be done from the states alone: every rank of an epoch-level run holds the same
plan (one global order, shared out as every ``W``-th id), the scores merged at the epoch's
start plus the fresh ones of its own share (marked in ``shares``), and its position. So the
ids trained so far in the epoch in progress are known (each old rank's first ``position``
batches), the scores every rank would have merged at the next epoch can be merged now (the
same rule as the per-epoch merge, ``shares.contribution`` and ``combine``), and the rest of
the epoch is dealt out to the new ranks (``dealing.deal_rest``): nothing trained twice,
nothing left out. Later epochs are planned by the new ranks as any epoch is, from the
merged scores and the seed, with their own world size.

What each new rank gets: the merged scores; the plan in progress with the ids already
trained (``EpochPlan.done``) and the world size it was made for; its share of the rest
marked as its own; the noise guard, the start rule's percentiles and the history (the same on every rank); the counts
of all old ranks summed on rank 0 (zero on the others), so their sum over ranks is kept.
"""

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.resuming.run_states import resumed_state
from neuron_sift.epoch.scores.rank_shares import combine, contribution


def _done_ids(states: list[dict[str, Any]], plan: EpochPlan, planner: EpochPlanner) -> np.ndarray:
    """The ids of ``plan`` trained before the states were taken: each old rank's first
    ``position`` batches (a plan resumed before also brings the ids done before that)."""
    done = [plan.done.numpy()] if plan.done is not None else []
    for s in states:
        old = planner.as_rank(len(states), int(s["planner"]["rank"]))
        done += old.rank_batches_of(plan)[: int(s["progress"]["position"])]
    return np.concatenate(done) if done else np.empty(0, dtype=np.int64)


def reshard(read: list[dict[str, Any]], planner: EpochPlanner) -> dict[str, Any]:
    """This rank's state (``planner``'s rank of its world size) from every old rank's state of
    a replicated run (read, in rank order, checked to be one run's at one step:
    ``run_states.resume_from_ranks``); ValueError if the epoch in progress cannot be dealt
    out to this world size."""
    first = read[0]
    mine = torch.zeros(planner.n, dtype=torch.bool)
    summed = sum(contribution(s["tables"]["scores"], s["shares"]["mine"], s["shares"]["carried"]) for s in read)
    scores = combine(torch.as_tensor(summed), first["tables"]["scores"])
    in_progress = any(bool(s["progress"]["in_progress"]) for s in read)
    plan_state = first["progress"]["plan"]
    if plan_state is not None:
        plan = EpochPlan.from_state(plan_state)
        done = planner.trained_ids(plan).numpy() if not in_progress else _done_ids(read, plan, planner)
        plan = replace(plan, world_size=plan.world_size or len(read), done=torch.from_numpy(done.astype(np.int64)))
        batches = planner.rank_batches_of(plan)  # raises where the rest cannot be dealt out
        if batches:
            mine[torch.from_numpy(np.concatenate(batches))] = True
        plan_state = plan.state_dict()
    shares = {"mine": mine, "carried": torch.zeros(planner.n, dtype=torch.bool)}
    return resumed_state(read, planner, plan_state, scores, shares, first["guard"], first["start"])
