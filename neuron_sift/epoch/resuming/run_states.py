"""Every rank's checkpoint of a run read as one run at one step: the checks shared by the
exact resume at the run's own world size and the resume at another (``replicated_reshard.py``
for a replicated table, ``sharded_reshard.py`` for a sharded one), and the state both build.

Why the same checks on both paths: states of different runs, epochs or steps would train
samples twice or leave some out, at any world size; a rank refuses them before any part
changes, naming each rank's step.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch

from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.planning.run_identity import RUN_WIDE
from neuron_sift.epoch.resuming.state_layout import FORMAT, SharesCheck, check_rank_state
from neuron_sift.shared.state_checks import need_int, need_mapping


def read_run(states: Sequence[dict[str, Any]], verify: bool = True) -> list[dict[str, Any]]:
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
        for key in RUN_WIDE:
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


def check_lockstep(read: list[dict[str, Any]], sharded: bool) -> None:
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


def check_each(read: list[dict[str, Any]], planner: EpochPlanner, shares: SharesCheck) -> None:
    """Each old rank's state checked as that rank's loader checks its own (``check_rank_state``)."""
    for r, s in enumerate(read):
        try:
            check_rank_state(s, planner.as_rank(len(read), r), shares)
        except ValueError as e:
            raise ValueError(f"rank {r}'s state (of {len(read)}): {e}") from None


def own_state(states: Sequence[dict[str, Any]], planner: EpochPlanner) -> dict[str, Any] | None:
    """This rank's own state (as given) when ``states`` are every rank's of a run at
    ``planner``'s world size, checked to be taken at one step; None when they are of another
    world size (the score table's ``resume`` resumes them). Only the fields compared are read here (no
    checksum: each rank verifies its own state when it loads it)."""
    if len(states) != planner.world_size:
        return None
    read = read_run(states, verify=False)
    check_lockstep(read, planner.plans_own_share)
    at = [int(FORMAT.read(s, verify=False)["planner"]["rank"]) for s in states]
    return states[at.index(planner.rank)]


def resumed_state(
    read: list[dict[str, Any]],
    planner: EpochPlanner,
    plan_state: dict[str, Any] | None,
    scores: torch.Tensor,
    shares: dict[str, Any],
    guard: dict[str, Any],
    start: dict[str, Any],
) -> dict[str, Any]:
    """This rank's state at ``planner``'s world size from every old rank's (``read``, in rank
    order): at position 0 of ``plan_state`` (the plan in progress, its done ids named), the
    merged ``scores``, ``shares``, ``guard`` and ``start`` (the start rule's); the history as every rank holds it, and the
    counts of all old ranks summed on rank 0 (zero on the others, so their sum is kept)."""
    first, rank0 = read[0], planner.rank == 0
    in_progress = any(bool(s["progress"]["in_progress"]) for s in read)
    return FORMAT.write(
        {
            "in_progress": in_progress,
            "planner": {**first["planner"], "world_size": planner.world_size, "rank": planner.rank},
            "progress": {
                "epochs_started": first["progress"]["epochs_started"],
                "in_progress": in_progress,
                "position": 0,
                "plan": plan_state,
            },
            "tables": {"scores": scores, "nonfinite": sum(int(s["tables"]["nonfinite"]) for s in read) if rank0 else 0},
            "shares": shares,
            "guard": guard,
            "start": start,
            "pairing": {key: sum(int(s["pairing"][key]) for s in read) if rank0 else 0 for key in first["pairing"]},
            "history": first["history"],
        }
    )


Resume = Callable[[list[dict[str, Any]], EpochPlanner], dict[str, Any]]


def resume_from_ranks(
    states: Sequence[dict[str, Any]], planner: EpochPlanner, shares: SharesCheck, resume: Resume
) -> dict[str, Any]:
    """This rank's state from every rank's states of a run at another world size: read,
    each checked as its own rank's loader would, checked to be at one step, then made into
    this rank's by the score table's ``resume`` (``score_table.py``)."""
    read = read_run(states)
    check_each(read, planner, shares)
    check_lockstep(read, planner.plans_own_share)
    return resume(read, planner)
