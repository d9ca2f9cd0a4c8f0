"""Checks of the progress's state (the plan and the position in it) against the planner
that loads it (the planner's own state: ``planning/planner_state.py``).

Why against the planner: what a valid plan is depends on the setup that trains it. Its ids
must be samples the user's sampler yields (a plan never trains a sample the user did not
give it), each once; under a sharded table a plan holds only its own rank's samples and
its weights are indexed by that rank's slots; the position must lie within this rank's
batches of the plan (a position past them would drop the rest of the epoch without a
word). Every refusal names the field (``neuron_sift.shared.state_checks``).

The checked plan shares the state's tensors (no copy): the loader copies what it keeps.
"""

from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.shared.state_checks import (
    invalid,
    need_bool,
    need_choice,
    need_distinct,
    need_ids,
    need_int,
    need_mapping,
    need_values,
    need_vector,
)

KINDS = ("warmup", "sift", "sift-unscored", "held", "anneal")


def outside_support(planner: EpochPlanner, ids: np.ndarray) -> int | None:
    """An id of ``ids`` that the user's sampler never yields, or None."""
    support = planner.support
    if support is None or not ids.size:
        return None
    at = np.minimum(np.searchsorted(support, ids), max(support.shape[0] - 1, 0))
    bad = support[at] != ids if support.size else np.ones(ids.shape, dtype=bool)
    return int(ids[bad][0]) if bad.any() else None


def check_plan_state(planner: EpochPlanner, state: Any, field: str = "progress.plan") -> EpochPlan:
    """``state`` (an ``EpochPlan.state_dict()``) as the plan it holds, sharing its tensors, or a
    ``ValueError`` naming the field that ``planner`` cannot train."""
    need_mapping(state, field, ("epoch", "kind", "order", "weights", "excluded"))
    epoch = need_int(state["epoch"], f"{field}.epoch")
    kind = need_choice(state["kind"], f"{field}.kind", KINDS)
    excluded = need_int(state["excluded"], f"{field}.excluded", 0, planner.m, "samples the guard left out")
    resumed = state.get("done") is not None
    world = planner.world_size
    if resumed:
        world = need_int(state.get("world_size"), f"{field}.world_size", 1, planner.m, "the plan's world size")
    order = need_ids(state["order"], f"{field}.order", planner.n)
    stray = outside_support(planner, order)
    if stray is not None:
        invalid(f"{field}.order", f"holds sample id {stray}, which this loader's sampler never yields")
    planner.check_order(order, f"{field}.order", resumed, world)
    done = None
    if resumed:
        done_ids = need_ids(state["done"], f"{field}.done", planner.n)
        need_distinct(done_ids, f"{field}.done", planner.n)
        done = state["done"]
    sharded = planner.plans_own_share
    inclusion = state.get("inclusion")
    if inclusion is not None:
        if sharded:
            invalid(f"{field}.inclusion", "must be absent under a sharded score table (its weights are 1 / pi)")
        need_vector(inclusion, f"{field}.inclusion", torch.float32, planner.n, "sample")
        need_values(inclusion, f"{field}.inclusion", 0.0, 1.0)
    plan = EpochPlan(epoch, kind, state["order"], torch.empty(0), inclusion, excluded, world if resumed else None, done)
    if done is not None:
        trained = order if sharded else planner.trained_ids(plan).numpy()
        pool = np.zeros(planner.n, dtype=bool)
        pool[trained] = True
        stray_done = done.numpy()[~pool[done.numpy()]]
        if stray_done.size:
            invalid(f"{field}.done", f"holds sample id {int(stray_done[0])}, which the plan does not train")
    size = planner.table_size_for(plan)
    weights = need_vector(state["weights"], f"{field}.weights", torch.float32, size, "entry of this rank's table")
    need_values(weights, f"{field}.weights", 0.0, low_open=True)
    plan.weights = weights
    return plan


def check_progress_state(planner: EpochPlanner, state: Any) -> tuple[EpochPlan | None, list[np.ndarray]]:
    """``state`` (an ``EpochProgress.state_dict()``) as its plan (sharing the state's tensors)
    and this rank's batches of it, or a ``ValueError`` naming the field."""
    need_mapping(state, "progress", ("epochs_started", "in_progress", "position", "plan"))
    started = need_int(state["epochs_started"], "progress.epochs_started")
    in_progress = need_bool(state["in_progress"], "progress.in_progress")
    if state["plan"] is None:
        if started or in_progress:
            invalid(
                "progress.plan",
                f"is None but {started} epoch(s) started: a loader that started an epoch holds its plan",
            )
        need_int(state["position"], "progress.position", 0, 0, "no epoch is planned")
        return None, []
    plan = check_plan_state(planner, state["plan"])
    if plan.epoch != started - 1:
        invalid(
            "progress.plan.epoch",
            f"is {plan.epoch} but progress.epochs_started is {started}: the plan saved is the current epoch's "
            "(epochs_started - 1, 0-based)",
        )
    batches = planner.rank_batches_of(plan)
    what = (
        f"batches of this rank's {len(batches)} in epoch {plan.epoch} (0-based) whose losses were recorded or skipped"
    )
    need_int(state["position"], "progress.position", 0, len(batches), what)
    return plan, batches
