"""The epoch loader's checkpoint: each part's own ``state_dict`` under its name, plus a
version.

Why a version: a checkpoint outlives the code that wrote it. A state names its layout, so
a loader either reads it exactly (converting an older layout it knows) or refuses it
saying which version it got and which it reads; never a half-understood resume.

Version 2 (current)::

    {"version": 2, "kind": "EpochSiftingDataloader",
     "in_progress": bool,          # a copy of progress["in_progress"], for tools and scripts
     "planner":  {"seed", "n", "batch_size", "world_size", "rank", "policy", "kept_share",
                  and "support_size", "support_crc32" when the user's sampler covers part of
                  the dataset (absent: every sample)},
     "progress": {"epochs_started", "in_progress", "position",
                  "plan": None or {"epoch", "kind", "order", "weights", "inclusion", "excluded"}},
     "tables":   {"scores", "nonfinite"},
     "shares":   {"mine", "carried"},
     "guard":    {"streak"},
     "pairing":  {"losses_recorded", "batches_recorded", "batches_skipped", "batches_yielded",
                  "dropped_batches"},  # batches_skipped is newer: a state without it skipped none
     "history":  {"epochs": [one dict per planned epoch]}}

Version 1 (one flat dict, written before the loader was split into parts) is converted:
the same values, regrouped; it kept no count of unpaired batches, so that count restarts
at 0, as version 1's own loader did on resume.
"""

from typing import Any

from neuron_sift.dataloader.checkpoint import state_kind

STATE_KIND = "EpochSiftingDataloader"
STATE_VERSION = 2
PARTS = ("planner", "progress", "tables", "shares", "guard", "pairing", "history")

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


def current_layout(state: Any) -> dict[str, Any]:
    """``state`` in the current layout, or a ``ValueError`` naming what it is instead."""
    kind = state_kind(state)
    if kind != STATE_KIND:
        what = (
            f"it comes from {kind}.state_dict(); load it with {kind}.load_state_dict()"
            if kind is not None
            else f"got a {type(state).__name__} that is no loader's state"
        )
        raise ValueError(
            f"not an EpochSiftingDataloader state: {what} (an EpochSiftingDataloader reads its own states, "
            f"version {STATE_VERSION}; version 1 is converted)"
        )
    version = state.get("version")
    if version == 1:
        return _from_version_1(state)
    if version != STATE_VERSION:
        raise ValueError(
            f"EpochSiftingDataloader state version {version!r} is not supported: this neuron_sift reads "
            f"version {STATE_VERSION} (and converts version 1)"
        )
    _require(state, PARTS, version)
    return state


def _require(state: dict[str, Any], keys: Any, version: Any) -> None:
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"EpochSiftingDataloader state version {version} is incomplete: no {', '.join(missing)}")


def _from_version_1(old: dict[str, Any]) -> dict[str, Any]:
    _require(old, _V1_KEYS, 1)
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
