"""The epoch loader's checkpoint: each part's own ``state_dict`` under its name, in the
package's envelope (``neuron_sift.shared.checkpoints``: kind, version, refusals, upgrades).

Version 3 (current)::

    {"version": 3, "kind": "EpochSiftingDataloader",
     "in_progress": bool,          # a copy of progress["in_progress"], for tools and scripts
     "planner":  {"seed", "n", "batch_size", "world_size", "rank", "policy", "kept_share",
                  "max_pruned_share", "reference", and "support_size", "support_crc32" when
                  the user's sampler covers part of the dataset (absent: every sample),
                  "score_table" when not "replicated"},  # planning/run_identity.py
     "progress": {"epochs_started", "in_progress", "position",
                  "plan": None or {"epoch", "kind", "order", "weights", "inclusion", "excluded"}},
     "tables":   {"scores", "nonfinite"},
     "shares":   {"mine", "carried"},
     "guard":    {"streak"},
     "start":    {"previous", "started"},  # the start rule: percentiles at the last scored opening
     "pairing":  {"losses_recorded", "batches_recorded", "batches_skipped", "batches_yielded",
                  "dropped_batches"},  # batches_skipped is newer: a state without it skipped none
     "history":  {"epochs": [one dict per planned epoch]}}  # "observed_kept_share" is newer:
                                                             # read from "kept_share" when absent

Under a sharded score table (``score_table="sharded"``, named in ``planner``) each rank's
state holds its own share: ``tables["scores"]`` and ``guard["streak"]`` by slot (the
samples it owns, then any it hosts for an epoch resumed at another world size), the plan
its own (``order`` its kept ids, ``weights`` by slot, no ``inclusion``), ``shares`` empty;
the guard's streak is empty while the guard is off (either table).

Every state also holds a ``"checksum"`` of its content (``neuron_sift.shared.checkpoints``):
a state changed after ``state_dict()`` wrote it is refused; states of older versions have
none and load as before. And each part checks its own state against the loader that loads it (``check_state``,
``planning/plan_checks.py``), all of them before any part changes: a refused state leaves the loader
as it was.

Version 2 (neuron_sift 0.6.0 to 0.8.0) had no ``start`` part: it loads with no percentiles
of an earlier opening, so with the start rule on the next sifted epoch trains every sample.
Version 1 (one flat dict, written before the loader was split into parts) is converted:
the same values, regrouped; it kept no count of unpaired batches, so that count restarts
at 0, as version 1's own loader did on resume.
"""

from collections.abc import Callable
from typing import Any

import torch

from neuron_sift.epoch.planning.plan_checks import check_progress_state
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.running.history import EpochHistory
from neuron_sift.epoch.running.pairing import PairingQueue
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.epoch.selection.guard import NoiseGuard
from neuron_sift.epoch.selection.start_rule import StartRule
from neuron_sift.shared.checkpoints import StateFormat, require
from neuron_sift.shared.state_checks import invalid, need_bool

STATE_KIND = "EpochSiftingDataloader"
STATE_VERSION = 3
PARTS = ("planner", "progress", "tables", "shares", "guard", "start", "pairing", "history")

_V1_KEYS = (
    "policy",
    "kept_share",
    "n",
    "batch_size",
    "rank",
    "world_size",
    "seed",
    "epochs_started",
    "in_progress",
    "position",
    "plan",
    "scores",
    "nonfinite",
    "mine",
    "carried",
    "streak",
    "history",
    "counts",
)


def _from_version_1(old: dict[str, Any]) -> dict[str, Any]:
    require(old, _V1_KEYS, f"{STATE_KIND} state version 1")
    counts = old["counts"]
    return {
        "version": STATE_VERSION,
        "kind": STATE_KIND,
        "in_progress": old["in_progress"],
        "planner": {key: old[key] for key in ("seed", "n", "batch_size", "world_size", "rank", "policy", "kept_share")},
        "progress": {key: old[key] for key in ("epochs_started", "in_progress", "position", "plan")},
        "tables": {"scores": old["scores"], "nonfinite": old["nonfinite"]},
        "shares": {"mine": old["mine"], "carried": old["carried"]},
        "guard": {"streak": old["streak"]},
        "pairing": {
            "losses_recorded": counts["losses_recorded"],
            "batches_recorded": counts["batches_recorded"],
            "batches_yielded": counts["batches_yielded"],
            "dropped_batches": 0,
        },
        "history": {"epochs": old["history"]},
    }


def _from_version_2(old: dict[str, Any]) -> dict[str, Any]:
    """Version 2 (0.6.0 to 0.8.0) had no start rule: no percentiles of an earlier opening."""
    return {
        **old,
        "version": STATE_VERSION,
        "start": {"previous": torch.zeros(0, dtype=torch.float32), "started": False},
    }


def _from_version_1_to_3(old: dict[str, Any]) -> dict[str, Any]:
    return _from_version_2(_from_version_1(old))


FORMAT = StateFormat(STATE_KIND, STATE_VERSION, PARTS, upgrades={1: _from_version_1_to_3, 2: _from_version_2})


SharesCheck = Callable[[Any, int], None]


def check_rank_state(state: dict[str, Any], planner: EpochPlanner, shares: SharesCheck) -> None:
    """Every part's check of its own state (``state`` as ``FORMAT.read`` returns it) for the
    loader of ``planner``'s rank, or a ``ValueError`` naming the field: run before any part
    loads, so a refused state leaves the loader as it was. ``shares``: the score table's
    check of the shares' state (``RankShares.check_sized`` or ``OwnedShares.check_sized``).

    Why by a rank's planner and not by the parts' own ``check_state``: the same checks judge
    every old rank's state against that rank's layout (``run_states.check_each``), and the
    tables' state against the size the state's own plan gives them (its hosted guests).
    Each part's ``check_state`` is the same check for its own loader's rank."""
    planner.check_state(state["planner"])
    plan = check_progress_state(planner, state["progress"])[0]
    if need_bool(state["in_progress"], "in_progress") != state["progress"]["in_progress"]:
        invalid("in_progress", "differs from progress.in_progress (it is a copy of it)")
    ScoreTables.check_sized(state["tables"], planner.table_size_for(plan))
    shares(state["shares"], planner.n)
    NoiseGuard.check_sized(state["guard"], planner.owned_entries)
    StartRule.check_sized(state["start"], planner.owned_entries)
    PairingQueue.check_state(state["pairing"])
    EpochHistory.check_state(state["history"])
