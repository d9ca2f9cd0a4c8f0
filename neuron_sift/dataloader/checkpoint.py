"""Checkpoint content for ``SiftingDataloader.state_dict()``: plain tensors and Python values.

Everything here loads with ``torch.load(..., weights_only=True)``: tensors (on the CPU),
ints, floats, strings, bools, None, and lists/tuples/dicts of them. Kept samples not yet
emitted are saved as data, without their container types; the types are taken again from
the first source batch after loading, where the structure is checked to be the same.
"""

from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.default_batch import DefaultBatchTransform, DefaultSiftingBatch
from neuron_sift.data_model.leaves import Leaf
from neuron_sift.data_model.list_batch import ListBatch
from neuron_sift.data_model.tensor_batch import TensorBatch
from neuron_sift.dataloader.accumulator import BatchAccumulator
from neuron_sift.engine.state import SiftState

STATE_VERSION = 1


def to_cpu(value: Any) -> Any:
    """Tensors moved to the CPU, recursively through lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, list):
        return [to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def pending_to_state(batch: Optional[SiftingBatch]) -> Optional[dict]:
    if batch is None or len(batch) == 0:
        return None
    if isinstance(batch, DefaultSiftingBatch):
        return {
            "kind": "default",
            "size": len(batch),
            "signature": batch.structure.signature(),
            "leaves": [{"axis": leaf.axis, "value": to_cpu(leaf.value)} for leaf in batch.leaves],
        }
    if isinstance(batch, ListBatch):
        return {"kind": "list_batch", "inputs": to_cpu(batch.inputs), "labels": to_cpu(batch.labels)}
    if isinstance(batch, TensorBatch):
        return {"kind": "tensor_batch", "inputs": to_cpu(batch.inputs), "labels": to_cpu(batch.labels)}
    raise TypeError(
        f"state_dict() cannot save {len(batch)} pending samples of the custom SiftingBatch type "
        f"{type(batch).__name__}; save when loader.num_pending == 0, or use ListBatch/TensorBatch in your transform"
    )


@dataclass
class PendingSamples:
    """Kept samples restored from a checkpoint, waiting to be re-inserted before new ones."""

    state: dict

    @property
    def size(self) -> int:
        s = self.state
        if s["kind"] == "default":
            return int(s["size"])
        return len(s["inputs"])

    def bind(self, like: SiftingBatch) -> SiftingBatch:
        """Rebuild the samples as a batch of the same kind and structure as ``like``."""
        s = self.state
        if s["kind"] == "default":
            if not isinstance(like, DefaultSiftingBatch) or like.structure.signature() != s["signature"]:
                raise ValueError(
                    "the checkpoint's pending samples have another batch structure than the source batches "
                    f"after loading ({s['signature']} vs "
                    f"{like.structure.signature() if isinstance(like, DefaultSiftingBatch) else type(like).__name__})"
                )
            leaves: List[Leaf] = []
            for saved, current in zip(s["leaves"], like.leaves):
                value = saved["value"]
                if isinstance(value, torch.Tensor) and isinstance(current.value, torch.Tensor):
                    value = value.to(current.value.device)
                leaves.append(Leaf(value, saved["axis"]))
            return DefaultSiftingBatch(like.structure, leaves, int(s["size"]))
        if s["kind"] == "list_batch":
            return ListBatch(list(s["inputs"]), None if s["labels"] is None else list(s["labels"]))
        device = like.inputs.device if isinstance(like, TensorBatch) else torch.device("cpu")
        labels = s["labels"]
        return TensorBatch(s["inputs"].to(device), None if labels is None else labels.to(device))


def loader_state(sl: Any) -> dict:
    """``SiftingDataloader.state_dict()`` of the loader ``sl`` (see there)."""
    if sl._restored is not None:
        pending = sl._restored.state
    elif sl._staging is not None and len(sl._staging):
        pending = pending_to_state(sl._staging.pending_on_host())  # no new graph per pending count
    else:
        pending = pending_to_state(sl.pending_batch())
    sift_state = to_cpu(sl.sifter.state.tensors())
    counts = sl.counts.as_dict()
    # The device counter also sees the batches whose selection was never read back
    # (fixed mode on XLA), as in metrics().
    counts["num_nonfinite_losses"] = int(sift_state["num_nonfinite"])
    return {
        "version": STATE_VERSION,
        "selection_mode": sl.selection_mode,
        "beta_value": sl.sift_config.beta_value,
        "loss_history_length": sl.sift_config.loss_history_length,
        "sift_state": sift_state,
        "counts": counts,
        "delay_progress": sl._delay_progress,
        "epoch": sl._epoch,
        "epoch_in_progress": sl._epoch_in_progress,
        "source_batches_consumed": sl._consumed,
        "batch_size": sl._batch_size,
        "rank": sl.ranks.rank,
        "world_size": sl.ranks.world_size,
        "since_sync": sl._since_sync,
        "budget_left": sl._budget_left,
        "pending": pending,
    }


def restore_loader_state(sl: Any, state: dict) -> None:
    """``SiftingDataloader.load_state_dict()`` into the loader ``sl`` (see there)."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a SiftingDataloader state (version {STATE_VERSION} expected)")
    if (state.get("rank", 0), state.get("world_size", 1)) != (sl.ranks.rank, sl.ranks.world_size):
        raise ValueError(
            f"checkpoint was taken on rank {state.get('rank')} of {state.get('world_size')}, this loader is rank "
            f"{sl.ranks.rank} of {sl.ranks.world_size}: each rank must load its own state"
        )
    sl._since_sync = int(state.get("since_sync", 0))
    sl._budget_left = int(state.get("budget_left", 0))
    for key in ("selection_mode", "loss_history_length"):
        mine = getattr(sl.sift_config, key)
        if state[key] != mine:
            raise ValueError(f"checkpoint has {key}={state[key]!r} but this loader's config has {mine!r}")
    sl.sifter.state = SiftState(**{k: v.cpu() for k, v in state["sift_state"].items()})  # the sifter places it
    sl.counts = type(sl.counts)(**state["counts"])
    sl._delay_progress = int(state["delay_progress"])
    sl._epoch = int(state["epoch"])
    sl._batch_size = state["batch_size"]
    if sl._batch_size is not None and isinstance(sl.batch_transforms, DefaultBatchTransform):
        sl.batch_transforms.nominal_batch_size = sl._first_batch_size()
    sl._epoch_in_progress = bool(state["epoch_in_progress"])
    sl._consumed = int(state["source_batches_consumed"])
    sl._resume_skip = sl._consumed if sl._epoch_in_progress else None
    sl._accumulator = BatchAccumulator()
    sl._staging = None
    sl._restored = PendingSamples(state["pending"]) if state["pending"] is not None else None
    sl._iteration_token += 1  # iterators started before loading are void
    restored = sl._restored.size if sl._restored is not None else 0
    if restored != sl.counts.num_samples_pending:
        raise ValueError(
            f"inconsistent checkpoint: {restored} pending samples saved, counts say "
            f"{sl.counts.num_samples_pending}"
        )
