"""``ExactLengthLoader``'s state: its layouts (this one, version 1's and 0.4.0's
``EpochStream``), reading any of them, closing its open epoch, and what every rank's
states must agree on to be resumed together.

Why apart from the class: the Trainer's and Lightning's integrations read and rewrite these
states without a stream (``closed_epoch``, ``read_state``), and a state outlives the code
that wrote it: its layouts and conversions are one place to read.
"""

from collections.abc import Callable, Sequence
from typing import Any

from neuron_sift.shared.checkpoints import StateFormat, state_kind

_PARTS = ("loader", "steps_per_epoch", "passes", "in_pass", "pass_emitted", "pass_seen_before", "epoch_yielded")


def _from_version_1(state: dict[str, Any]) -> dict[str, Any]:
    """Version 1 (0.8.0 and before) did not count its consumer's epochs: unknown (None), so
    ``set_epoch`` cannot tell a new epoch from the restored one and changes nothing."""
    return {**state, "version": 2, "epochs_started": None}


STATE_FORMAT = StateFormat(
    "ExactLengthLoader",
    2,
    (*_PARTS, "epochs_started"),
    upgrades={1: _from_version_1},
    legacy=lambda state: "steps_per_epoch" in state and "loader" in state,
    unversioned=1,  # 0.4.0 and before saved neither kind nor version
)

# 0.4.0's ``EpochStream`` (the epoch Trainer integration's stream, now this class) saved
# the epoch loader's state, its epoch length and how far the open epoch had come.
EPOCH_STREAM_FORMAT = StateFormat(
    "EpochStream",
    1,
    ("loader", "per_epoch", "in_epoch"),
    legacy=lambda state: "per_epoch" in state and "in_epoch" in state,
    unversioned=1,
)


def closed_epoch(state: Any) -> dict[str, Any]:
    """An ``ExactLengthLoader`` state (any layout ``read_state`` reads) with its open epoch
    closed, as the uninterrupted run's next ``iter()`` closes an epoch that yielded its last
    batch: the pass in progress continues, the epoch's count starts again. For trainers that
    start a new epoch after a checkpoint taken at an epoch's end (the Hugging Face Trainer,
    Lightning), where the stream would otherwise continue the saved epoch's empty rest. The
    state is verified and written (and sealed) anew, never edited by hand."""
    read = read_state(state)
    return STATE_FORMAT.write({**{p: read[p] for p in STATE_FORMAT.parts}, "epoch_yielded": None})


def saved_world_size(loader_state: Any) -> int | None:
    """The world size a sifting loader's state was saved at, where it says (None otherwise)."""
    if not isinstance(loader_state, dict):
        return None
    for part in ("planner", "loader"):  # the epoch loader's planner, the per-batch loader's settings
        held = loader_state.get(part)
        if isinstance(held, dict) and isinstance(held.get("world_size"), int):
            return int(held["world_size"])
    return None


def read_state(state: Any) -> dict[str, Any]:
    """An ``ExactLengthLoader`` state in the current layout; a state of 0.4.0's ``EpochStream``
    is converted (the open epoch's position is kept; the count of passes, which the epoch
    mode does not use, starts at 0)."""
    if state_kind(state) != "EpochStream":
        return STATE_FORMAT.read(state)
    old = EPOCH_STREAM_FORMAT.read(state)
    in_epoch = int(old["in_epoch"])
    return {
        "kind": STATE_FORMAT.kind,
        "version": STATE_FORMAT.version,
        "loader": old["loader"],
        "steps_per_epoch": int(old["per_epoch"]),
        "passes": 0,
        "in_pass": False,  # the epoch loader's own state continues its open epoch
        "pass_emitted": 0,
        "pass_seen_before": 0,
        "epoch_yielded": in_epoch if in_epoch else None,
        "epochs_started": None,
    }


def saved_rank(loader_state: Any) -> int | None:
    """The rank a sifting loader's state was saved on, where it says (None otherwise)."""
    for part in ("planner", "loader"):
        held = loader_state.get(part) if isinstance(loader_state, dict) else None
        if isinstance(held, dict) and isinstance(held.get("rank"), int):
            return int(held["rank"])
    return None


def same_step(read: Sequence[dict[str, Any]], same_world: bool) -> None:
    """Refuse every rank's states (read) unless their consumers stood at one step: the same
    passes, epochs and position in the open epoch (and, at the saving world size, the same
    epoch length); every rank yields as many batches as every other."""
    keys = ("passes", "in_pass", "epoch_yielded", "epochs_started") + (("steps_per_epoch",) if same_world else ())
    for key in keys:
        if len({repr(s[key]) for s in read}) > 1:
            raise ValueError(
                f"the states were taken at different steps of their consumers' epochs ({key}: "
                f"{', '.join(repr(s[key]) for s in read)} by rank): take every rank's state after the same step"
            )


def check_world_size(loader_state: Any, world: int) -> None:
    """Refuse a state saved at another world size than ``world``, naming both and the way to resume it."""
    saved = saved_world_size(loader_state)
    if saved is not None and saved != world:
        raise ValueError(
            f"the state was saved at world size {saved}, this loader runs at {world}: resume every rank's "
            "state with load_state_dict_from_ranks (PerRankLoaderState with dcp.load(..., "
            "planner=ReshardingLoadPlanner()) does that), or restart with the saving world size"
        )


def resized_steps(saved: dict[str, Any], epochs: int, planned: Callable[[int | None], int], steps: int) -> int:
    """The epoch length after a resume at another world size, for epochs sized by the consumer's
    ``epochs``: this world size's rest of the plan (``planned(None)``: its open epoch's rest and
    the later epochs; ``planned(k)`` for ``k`` epochs where the loader has no ``num_epochs``) in
    equal shares over the consumer's epochs left, the batches its open epoch counted included,
    rounded down as the default length is (the stream never runs past the plan). ``steps``
    where nothing is left to share or the state did not count its consumer's epochs."""
    started, yielded = saved["epochs_started"], saved["epoch_yielded"]
    if started is None:
        return steps
    current = int(started) - (1 if yielded is not None else 0)  # the consumer's open epoch, or its next
    left = epochs - current
    if left < 1:
        return steps
    try:
        rest = planned(None)
    except ValueError:  # no num_epochs: plan the consumer's epochs left
        rest = planned(left)
    return max(1, (rest + int(yielded or 0)) // left)
