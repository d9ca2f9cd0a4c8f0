"""``SiftingDataloader.state_dict()``: the composition of its parts' own states, with a version.

Each part saves itself under its name: ``loader`` (what must match to load: mode, history
length, batch size, rank), ``sift_state`` (the engine: loss history, counters, random
state), ``counts``, ``delay``, ``epoch`` (the loader's ``PassPosition``), ``agreement`` (the
data-parallel agreement in progress) and ``pending`` (kept samples not yet emitted, as
plain data). Everything loads with ``torch.load(..., weights_only=True)``.

The parts that are objects of their own (the sifter, counts, delay, position, agreement)
are ``shared.state_parts.StatePart``s; ``loader`` and ``pending`` are the loader's own
fields, checked here. Every part's state is checked before any part loads: a refused state
leaves the loader as it was.

Version 1 (neuron_sift 0.2.0) kept the same values in one flat dict; it is converted on
load. The envelope (``kind``, ``version``, the content's checksum, the refusals) is
``neuron_sift.shared.checkpoints``.
"""

import logging
from typing import Any

import torch

from neuron_sift.data_model.saved_batch import SavedBatch
from neuron_sift.data_model.structure import signature_leaves
from neuron_sift.dataloader.parts import PassPosition, SiftingParts, restored_pending_store
from neuron_sift.shared.checkpoints import StateFormat
from neuron_sift.shared.logs import LOADER_LOGGER
from neuron_sift.shared.state_checks import describe, invalid, need_int, need_mapping
from neuron_sift.shared.state_parts import StatePart, check_parts

logger = logging.getLogger(LOADER_LOGGER)

PARTS = ("loader", "sift_state", "counts", "delay", "epoch", "agreement", "pending")


def state_parts(sl: SiftingParts) -> dict[str, StatePart]:
    """The loader's parts that save, check and load their own state, by name."""
    return {
        "sift_state": sl.sifter,
        "counts": sl.counts,
        "delay": sl.delay,
        "epoch": sl.position,
        "agreement": sl.agreement,
    }


def loader_state(sl: SiftingParts) -> dict[str, Any]:
    """``SiftingDataloader.state_dict()`` of the loader ``sl`` (see there)."""
    sift_state = sl.sifter.state_dict()
    return FORMAT.write(
        {
            "loader": {
                "selection_mode": sl.selection_mode,
                "beta_value": sl.sift_config.beta_value,
                "criterion": sl.sift_config.criterion,
                "loss_history_length": sl.sift_config.loss_history_length,
                "batch_size": sl.batch_size,
                "rank": sl.ranks.rank,
                "world_size": sl.ranks.world_size,
            },
            "sift_state": sift_state,
            # Its non-finite count is the engine's (in sift_state), not restored from here.
            "counts": sl.counts.as_dict(int(sift_state["num_nonfinite"])),
            "delay": sl.delay.state_dict(),
            "epoch": sl.position.state_dict(),
            "agreement": sl.agreement.state_dict(),
            "pending": sl.pending.saved() if sl.pending is not None else None,
        }
    )


def upgrade_v1(state: dict[str, Any]) -> dict[str, Any]:
    """A version-1 state (one flat dict) in the version-2 layout."""
    return {
        "version": 2,
        "loader": {
            key: state[key]
            for key in ("selection_mode", "beta_value", "loss_history_length", "batch_size", "rank", "world_size")
        },
        "sift_state": state["sift_state"],
        "counts": state["counts"],
        "delay": {"progress": state["delay_progress"]},
        "epoch": {
            "epoch": state["epoch"],
            "in_progress": state["epoch_in_progress"],
            "consumed": state["source_batches_consumed"],
        },
        "agreement": {"since_sync": state.get("since_sync", 0), "budget_left": state.get("budget_left", 0)},
        "pending": state["pending"],
    }


FORMAT = StateFormat(
    "SiftingDataloader", 2, PARTS, upgrades={1: upgrade_v1}, legacy=lambda state: "sift_state" in state
)


def epoch_in_progress(state: dict[str, Any]) -> bool:
    """Whether the checkpoint ``state`` (of any readable version) was taken within an epoch."""
    if isinstance(state, dict) and state.get("version") == 1:
        return bool(state["epoch_in_progress"])
    return bool(state["epoch"]["in_progress"])


def restore_loader_state(sl: SiftingParts, state: dict[str, Any]) -> None:
    """``SiftingDataloader.load_state_dict()`` into the loader ``sl`` (see there): every
    part's state checked (``check_loader_state``) before any part loads."""
    state = FORMAT.read(state)
    check_loader_state(sl, state)
    meta = state["loader"]
    saved = state["pending"]  # restored into a store of its own first: a failure changes nothing
    pending = None if saved is None else restored_pending_store(sl, saved, meta["batch_size"])
    if meta.get("beta_value") is not None and meta["beta_value"] != sl.sift_config.beta_value:
        logger.warning(
            "SiftingDataloader: resumed a checkpoint taken with beta_value=%r under beta_value=%r: selections from "
            "here on keep samples with the new one (the loss history, counters and pending samples stay valid)",
            meta["beta_value"],
            sl.sift_config.beta_value,
        )
    sl.agreement.load_state_dict(state["agreement"])
    sl.sifter.load_state_dict(state["sift_state"])  # the sifter places it
    sl.counts.load_state_dict(state["counts"])
    sl.delay.load_state_dict(state["delay"])
    position = PassPosition()
    position.load_state_dict(state["epoch"])
    sl.position = position  # a new object: a pass made before the load keeps its own
    sl.restore_pending(meta["batch_size"], pending)


def check_loader_state(sl: SiftingParts, state: dict[str, Any]) -> None:
    """Refuse a state (as ``FORMAT.read`` returns it) the loader ``sl`` cannot restore: its
    settings (``loader``), each part's own state, the pending samples; changes nothing."""
    meta = need_mapping(state["loader"], "loader", ("selection_mode", "loss_history_length", "batch_size"))
    theirs = (meta.get("rank", 0), meta.get("world_size", 1))
    if theirs != (sl.ranks.rank, sl.ranks.world_size):
        raise ValueError(
            f"checkpoint was taken on rank {theirs[0]} of {theirs[1]} rank(s), this loader is rank "
            f"{sl.ranks.rank} of {sl.ranks.world_size}: each rank loads the state it saved, at the world size it "
            "saved it at (SiftingDataloader does not resume at another world size; EpochSiftingDataloader does, "
            "with load_state_dict_from_ranks)"
        )
    for key in ("selection_mode", "loss_history_length"):
        mine = getattr(sl.sift_config, key)
        if meta[key] != mine:
            raise ValueError(f"checkpoint has {key}={meta[key]!r} but this loader's config has {mine!r}")
    criterion = meta.get("criterion", "loss")  # states without it ranked the loss
    if criterion != sl.sift_config.criterion:
        raise ValueError(
            f"checkpoint ranked samples by criterion={criterion!r}, this loader's config by "
            f"{sl.sift_config.criterion!r}: its loss history holds values of the other scale; resume with the "
            "checkpoint's criterion"
        )
    saved_batch, batch = meta["batch_size"], sl.batch_size
    if saved_batch is not None and batch is not None and saved_batch != batch:
        raise ValueError(
            f"checkpoint was taken with batch size {saved_batch}, this loader's source loader has batch size {batch}: "
            f"the checkpoint's pending samples and emitted batches hold {saved_batch} samples each. Resume with the "
            "source loader's batch size the checkpoint was saved with"
        )
    if saved_batch is not None:
        need_int(saved_batch, "loader.batch_size", 1)
    check_parts(state_parts(sl), state)
    pending = state["pending"]
    restored = 0 if pending is None else _saved_size(pending, saved_batch)
    if restored != int(state["counts"]["num_samples_pending"]):
        raise ValueError(
            f"inconsistent checkpoint: {restored} pending samples saved, counts say "
            f"{state['counts']['num_samples_pending']}"
        )


def _saved_size(pending: Any, batch_size: int | None) -> int:
    """How many samples the saved ``pending`` ones are (refused unless saved ones of a known
    batch size)."""
    try:
        saved = SavedBatch(pending)
    except ValueError as e:
        invalid("pending", f"must be None or saved pending samples ({e})")
    if batch_size is None:
        invalid("pending", "holds samples but loader.batch_size is None (pending samples come after a scored batch)")
    if saved.is_default:
        fields = need_mapping(pending, "pending", ("size", "signature", "leaves"))
        size = need_int(fields["size"], "pending.size", 0)
        _check_leaves(fields["leaves"], fields["signature"], size)
        return size
    inputs = need_mapping(pending, "pending", ("inputs", "labels"))["inputs"]
    if not hasattr(inputs, "__len__"):
        invalid("pending.inputs", f"must be a list or tensor of samples, got {describe(inputs)}")
    return saved.size


def _check_leaves(leaves: Any, signature: Any, size: int) -> None:
    """The saved leaves: as many as the signature names, each an ``axis`` and a ``value`` (a
    tensor, or a list of per-sample objects) holding ``size`` samples along it; their
    containers are bound to the first batch after the resume, which checks the signature."""
    if not isinstance(leaves, list):
        invalid("pending.leaves", f"must be a list, got {describe(leaves)}")
    named = signature_leaves(signature)
    if named is None:
        invalid("pending.signature", f"is not a batch structure's signature: {describe(signature)}")
    if len(leaves) != named:
        invalid("pending.leaves", f"holds {len(leaves)} leaves but the signature names {named}")
    for i, leaf in enumerate(leaves):
        fields = need_mapping(leaf, f"pending.leaves[{i}]", ("axis", "value"))
        axis, value = fields["axis"], fields["value"]
        if not isinstance(axis, int) or isinstance(axis, bool):
            invalid(f"pending.leaves[{i}].axis", f"must be an int, got {describe(axis)}")
        if isinstance(value, torch.Tensor):
            held = value.shape[axis] if 0 <= axis < value.dim() else None
        elif isinstance(value, list):  # a leaf of per-sample objects (strings, dicts): along axis 0 its length
            held = len(value) if axis == 0 else size
        else:
            invalid(f"pending.leaves[{i}].value", f"must be a tensor or a list of samples, got {describe(value)}")
        if held != size:
            invalid(f"pending.leaves[{i}]", f"does not hold {size} samples along axis {axis}")
