"""Kept samples as checkpoint data: plain values and CPU tensors, without container types.

Everything here loads with ``torch.load(..., weights_only=True)``: tensors (on the CPU),
ints, floats, strings, bools, None, and lists/tuples/dicts of them. The container types
(the user's dicts, namedtuples, ``BatchEncoding``) are not saved: they are taken again
from the first source batch after loading, where the structure is checked to be the same.
"""

from typing import Any

import torch

from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.default_sifting_batch import DefaultSiftingBatch
from neuron_sift.data_model.leaves import Leaf
from neuron_sift.data_model.list_batch import ListBatch
from neuron_sift.data_model.tensor_batch import TensorBatch


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


class SavedBatch:
    """Samples saved by ``of`` (a dict of plain values), rebuilt by ``bind``."""

    def __init__(self, state: dict):
        if not isinstance(state, dict) or state.get("kind") not in ("default", "list_batch", "tensor_batch"):
            raise ValueError(f"not saved pending samples: {type(state).__name__}")
        self.state = state

    @staticmethod
    def of(batch: SiftingBatch | None) -> dict | None:
        """``batch`` as checkpoint data, or None when there is nothing to save."""
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

    @property
    def is_default(self) -> bool:
        """Samples of the default batch handling (the only kind a device store holds)."""
        return bool(self.state["kind"] == "default")

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
            leaves: list[Leaf] = []
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
