"""Resuming at another world size: every rank's checkpoint of a run at ``W`` ranks made into
this rank's state of the same run at ``W'`` ranks.

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
marked as its own; the noise guard and the history (the same on every rank); the counts
of all old ranks summed on rank 0 (zero on the others), so their sum over ranks is kept.
"""

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.checkpoint import FORMAT
from neuron_sift.epoch.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.reowning import reown
from neuron_sift.epoch.sharded import ShardedPlanner
from neuron_sift.epoch.shares import combine, contribution

_RUN_SETTINGS = ("seed", "n", "batch_size", "policy", "kept_share", "support_size", "support_crc32")


def _check_run(states: list[dict[str, Any]]) -> None:
    """The states are every rank's of one run at one step: refused otherwise, naming why."""
    world = len(states)
    ranks = sorted(int(s["planner"]["rank"]) for s in states)
    if ranks != list(range(world)) or any(int(s["planner"]["world_size"]) != world for s in states):
        sizes = sorted({int(s["planner"]["world_size"]) for s in states})
        raise ValueError(
            f"resuming at another world size needs the state of every rank of the run, each once: got ranks "
            f"{ranks} of world size(s) {sizes}"
        )
    first = states[0]
    for s in states[1:]:
        for key in _RUN_SETTINGS:
            if s["planner"].get(key) != first["planner"].get(key):
                raise ValueError(f"the states are of different runs: {key} differs between ranks")
        if s["progress"]["epochs_started"] != first["progress"]["epochs_started"]:
            raise ValueError("the states were taken in different epochs: take every rank's at the same step")
        a, b = s["progress"]["plan"], first["progress"]["plan"]
        if a is not None and b is not None and "score_table" in first["planner"]:  # sharded: each rank its own plan
            same = a["epoch"] == b["epoch"] and a["kind"] == b["kind"]
        else:
            same = a is None and b is None or (a is not None and b is not None and torch.equal(a["order"], b["order"]))
        if not same:
            raise ValueError("the states hold different plans: they are of different runs or epochs")


def _done_ids(states: list[dict[str, Any]], plan: EpochPlan, planner: EpochPlanner) -> np.ndarray:
    """The ids of ``plan`` trained before the states were taken: each old rank's first
    ``position`` batches (a plan resumed before also brings the ids done before that)."""
    old = copy.copy(planner)
    old.world_size = len(states)
    done = [plan.done.numpy()] if plan.done is not None else []
    for s in states:
        old.rank = int(s["planner"]["rank"])
        done += old.rank_batches_of(plan)[: int(s["progress"]["position"])]
    return np.concatenate(done) if done else np.empty(0, dtype=np.int64)


def reshard(states: Sequence[dict[str, Any]], planner: EpochPlanner) -> dict[str, Any]:
    """This rank's state (``planner``'s rank of its world size) from every rank's
    ``state_dict()`` of a run at any world size; ValueError if they are not one run's states
    at one step, or if the epoch in progress cannot be dealt out to this world size."""
    read = [FORMAT.read(s) for s in states]
    if not read:
        raise ValueError("resuming at another world size needs the state of every rank of the run; got none")
    read.sort(key=lambda s: int(s["planner"]["rank"]))
    _check_run(read)
    planner.check_state({**read[0]["planner"], "world_size": planner.world_size, "rank": planner.rank})
    if isinstance(planner, ShardedPlanner):
        return reown(read, planner)
    first, w_new = read[0], planner.world_size
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
    rank0 = planner.rank == 0
    counts = {key: sum(int(s["pairing"][key]) for s in read) if rank0 else 0 for key in first["pairing"]}
    return FORMAT.write(
        {
            "in_progress": in_progress,
            "planner": {**first["planner"], "world_size": w_new, "rank": planner.rank},
            "progress": {
                "epochs_started": first["progress"]["epochs_started"],
                "in_progress": in_progress,
                "position": 0,
                "plan": plan_state,
            },
            "tables": {
                "scores": scores,
                "nonfinite": sum(int(s["tables"]["nonfinite"]) for s in read) if rank0 else 0,
            },
            "shares": {"mine": mine, "carried": torch.zeros(planner.n, dtype=torch.bool)},
            "guard": first["guard"],
            "pairing": counts,
            "history": first["history"],
        }
    )
