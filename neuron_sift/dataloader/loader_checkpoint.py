"""``SiftingDataloader.state_dict()``: the composition of its parts' own states, with a version.

Each part saves itself under its name: ``loader`` (what must match to load: mode, history
length, batch size, rank), ``sift_state`` (the engine: loss history, counters, random
state), ``counts``, ``delay``, ``epoch`` (the loader's ``PassPosition``), ``agreement`` (the
data-parallel agreement in progress) and ``pending`` (kept samples not yet emitted, as
plain data). Everything loads with ``torch.load(..., weights_only=True)``.

Version 1 (neuron_sift 0.2.0) kept the same values in one flat dict; it is converted on
load. The envelope (``kind``, ``version``, the content's checksum, the refusals) is
``neuron_sift.shared.checkpoints``.
"""

import logging
from typing import Any

from neuron_sift.data_model.saved_batch import SavedBatch, to_cpu
from neuron_sift.dataloader.parts import LoaderParts, PassPosition
from neuron_sift.engine.state import SiftState
from neuron_sift.shared.checkpoints import StateFormat
from neuron_sift.shared.logs import LOADER_LOGGER

logger = logging.getLogger(LOADER_LOGGER)

PARTS = ("loader", "sift_state", "counts", "delay", "epoch", "agreement", "pending")


def loader_state(sl: LoaderParts) -> dict[str, Any]:
    """``SiftingDataloader.state_dict()`` of the loader ``sl`` (see there)."""
    sift_state = to_cpu(sl.sifter.state.tensors())
    return FORMAT.write(
        {
            "loader": {
                "selection_mode": sl.selection_mode,
                "beta_value": sl.sift_config.beta_value,
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


def restore_loader_state(sl: LoaderParts, state: dict[str, Any]) -> None:
    """``SiftingDataloader.load_state_dict()`` into the loader ``sl`` (see there)."""
    state = FORMAT.read(state)
    meta = state["loader"]
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
    saved_batch, batch = meta["batch_size"], sl.batch_size
    if saved_batch is not None and batch is not None and saved_batch != batch:
        raise ValueError(
            f"checkpoint was taken with batch size {saved_batch}, this loader's source loader has batch size {batch}: "
            f"the checkpoint's pending samples and emitted batches hold {saved_batch} samples each. Resume with the "
            "source loader's batch size the checkpoint was saved with"
        )
    if meta.get("beta_value") is not None and meta["beta_value"] != sl.sift_config.beta_value:
        logger.warning(
            "SiftingDataloader: resumed a checkpoint taken with beta_value=%r under beta_value=%r: selections from "
            "here on keep samples with the new one (the loss history, counters and pending samples stay valid)",
            meta["beta_value"],
            sl.sift_config.beta_value,
        )
    pending = state["pending"]
    restored = 0 if pending is None else _saved_size(pending)
    if restored != int(state["counts"]["num_samples_pending"]):
        raise ValueError(
            f"inconsistent checkpoint: {restored} pending samples saved, counts say "
            f"{state['counts']['num_samples_pending']}"
        )
    sl.agreement.load_state_dict(state["agreement"])
    sl.sifter.state = SiftState(**{k: v.cpu() for k, v in state["sift_state"].items()})  # the sifter places it
    sl.counts.load_state_dict(state["counts"])
    sl.delay.load_state_dict(state["delay"])
    sl.position = PassPosition.from_state(state["epoch"])
    sl.restore_pending(meta["batch_size"], pending)


def _saved_size(pending: dict[str, Any]) -> int:
    return SavedBatch(pending).size
