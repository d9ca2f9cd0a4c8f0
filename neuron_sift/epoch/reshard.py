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

from neuron_sift.epoch.checkpoint import FORMAT, check_state
from neuron_sift.epoch.ownership import Ownership
from neuron_sift.epoch.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.reowning import reown
from neuron_sift.epoch.sharded import ShardedPlanner
from neuron_sift.epoch.shares import combine, contribution
from neuron_sift.shared.state_checks import need_int, need_mapping

_RUN_SETTINGS = ("seed", "n", "batch_size", "policy", "kept_share", "support_size", "support_crc32", "score_table")


def _old_rank(planner: EpochPlanner, world: int, rank: int) -> EpochPlanner:
    """``planner`` as rank ``rank`` of ``world`` saw it (its ownership, under a sharded table)."""
    old = copy.copy(planner)
    old.world_size, old.rank = world, rank
    if isinstance(old, ShardedPlanner):
        old.owner = Ownership(old.n, old.support, world, rank)
    return old


def _read_run(states: Sequence[dict[str, Any]], verify: bool = True) -> list[dict[str, Any]]:
    """The states read (envelope, and checksum unless not ``verify``), in rank order, checked
    to be every rank's of one run, each once."""
    read = [FORMAT.read(s, verify) for s in states]
    if not read:
        raise ValueError("resuming at another world size needs the state of every rank of the run; got none")
    world = len(read)
    layout = []
    for i, s in enumerate(read):
        planner = need_mapping(s["planner"], f"planner (of states[{i}])", ("world_size", "rank"))
        layout.append((need_int(planner["rank"], f"planner.rank (of states[{i}])"), planner["world_size"]))
    ranks = sorted(rank for rank, _ in layout)
    if ranks != list(range(world)) or any(size != world for _, size in layout):
        sizes = sorted({repr(size) for _, size in layout})
        raise ValueError(
            f"resuming at another world size needs the state of every rank of the run, each once: got ranks "
            f"{ranks} of world size(s) {', '.join(sizes)}"
        )
    read.sort(key=lambda s: int(s["planner"]["rank"]))
    first = read[0]["planner"]
    for r, s in enumerate(read[1:], start=1):
        for key in _RUN_SETTINGS:
            if s["planner"].get(key) != first.get(key):
                raise ValueError(
                    f"the states are of different runs: {key} differs between ranks "
                    f"(rank 0: {first.get(key)!r}, rank {r}: {s['planner'].get(key)!r})"
                )
    return read


def _same_plan(a: Any, b: Any, sharded: bool) -> bool:
    """Whether two ranks' plan states are one epoch's plan as every rank holds it: the same
    order (of a sharded rank's own plan: the same epoch and kind) and, after a resume at
    another world size, the same ids done before it (then a sharded plan's order is every
    old rank's, the same on every rank)."""
    if a is None or b is None:
        return a is None and b is None
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    resumed = a.get("done") is not None
    if resumed != (b.get("done") is not None):
        return False
    keys = ("epoch", "kind") if sharded and not resumed else ("epoch", "kind", "order", "done", "world_size")
    for key in keys:
        x, y = a.get(key), b.get(key)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not (x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def _check_lockstep(read: list[dict[str, Any]], sharded: bool) -> None:
    """The states (every rank's, in rank order) were taken at one step: the same epoch, the
    same plan, and the same position in it. In lockstep training (every rank one batch per
    step) the positions are equal: a position counts the batches whose losses were recorded
    or skipped, so batches a prefetching loader pulled ahead do not move it (the pairing
    counts may differ), and after a resume at another world size every rank has as many
    batches of the rest as every other. Refused otherwise, naming each rank's step."""
    where = []
    for r, s in enumerate(read):
        progress = need_mapping(s["progress"], f"rank {r}'s progress", ("epochs_started", "position", "plan"))
        started = need_int(progress["epochs_started"], f"rank {r}'s progress.epochs_started")
        where.append((started, need_int(progress["position"], f"rank {r}'s progress.position")))
    if len({started for started, _ in where}) > 1:
        epochs = ", ".join(f"rank {r} in epoch {started - 1}" for r, (started, _) in enumerate(where))
        raise ValueError(
            f"the states were taken in different epochs ({epochs}, 0-based): take every rank's state at the same "
            "step (after the same optimizer step on every rank)"
        )
    first = read[0]["progress"]["plan"]
    for r, s in enumerate(read[1:], start=1):
        if not _same_plan(first, s["progress"]["plan"], sharded):
            raise ValueError(
                f"the states hold different plans (rank 0's and rank {r}'s): they are of different runs or "
                "epochs, or one was taken after a resume the other was not"
            )
    if len({position for _, position in where}) > 1:
        steps = ", ".join(f"rank {r} at batch {position}" for r, (_, position) in enumerate(where))
        raise ValueError(
            f"the states were taken at different steps of epoch {where[0][0] - 1} (0-based): {steps} (batches whose "
            "losses were recorded or skipped). In lockstep training every rank is at the same batch: resuming "
            "from these would train some samples twice or leave some out. Take every rank's state at the same "
            "step (after the same optimizer step on every rank)"
        )


def _check_each(read: list[dict[str, Any]], planner: EpochPlanner) -> None:
    """Each old rank's state checked as that rank's loader checks its own (``check_state``)."""
    for r, s in enumerate(read):
        try:
            check_state(s, _old_rank(planner, len(read), r))
        except ValueError as e:
            raise ValueError(f"rank {r}'s state (of {len(read)}): {e}") from None


def own_state(states: Sequence[dict[str, Any]], planner: EpochPlanner) -> dict[str, Any] | None:
    """This rank's own state (as given) when ``states`` are every rank's of a run at
    ``planner``'s world size, checked to be taken at one step; None when they are of another
    world size (``reshard`` resumes them). Only the fields compared are read here (no
    checksum: each rank verifies its own state when it loads it)."""
    if len(states) != planner.world_size:
        return None
    read = _read_run(states, verify=False)
    _check_lockstep(read, isinstance(planner, ShardedPlanner))
    at = [int(FORMAT.read(s, verify=False)["planner"]["rank"]) for s in states]
    return states[at.index(planner.rank)]


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
    read = _read_run(states)
    _check_each(read, planner)
    _check_lockstep(read, isinstance(planner, ShardedPlanner))
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
