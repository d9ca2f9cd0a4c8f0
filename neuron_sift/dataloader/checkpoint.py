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
from neuron_sift.data_model.default_batch import DefaultSiftingBatch, _Leaf
from neuron_sift.data_model.list_batch import ListBatch
from neuron_sift.data_model.tensor_batch import TensorBatch

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


def spec_signature(spec: Any) -> Any:
    """The structure of a parsed batch without its container types: nested lists of names."""
    kind = spec[0]
    if kind == "leaf":
        return ["leaf"]
    if kind == "map":
        return ["map", [str(k) for k in spec[2]], [spec_signature(c) for c in spec[3]]]
    return ["seq", [spec_signature(c) for c in spec[2]]]


def pending_to_state(batch: Optional[SiftingBatch]) -> Optional[dict]:
    if batch is None or len(batch) == 0:
        return None
    if isinstance(batch, DefaultSiftingBatch):
        return {
            "kind": "default",
            "size": len(batch),
            "signature": spec_signature(batch._spec),
            "leaves": [{"axis": leaf.axis, "value": to_cpu(leaf.value)} for leaf in batch._leaves],
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
            if not isinstance(like, DefaultSiftingBatch) or spec_signature(like._spec) != s["signature"]:
                raise ValueError(
                    "the checkpoint's pending samples have another batch structure than the source batches "
                    f"after loading ({s['signature']} vs "
                    f"{spec_signature(like._spec) if isinstance(like, DefaultSiftingBatch) else type(like).__name__})"
                )
            leaves: List[_Leaf] = []
            for saved, current in zip(s["leaves"], like._leaves):
                value = saved["value"]
                if isinstance(value, torch.Tensor) and isinstance(current.value, torch.Tensor):
                    value = value.to(current.value.device)
                leaves.append(_Leaf(value, saved["axis"]))
            return DefaultSiftingBatch(like._spec, leaves, int(s["size"]))
        if s["kind"] == "list_batch":
            return ListBatch(list(s["inputs"]), None if s["labels"] is None else list(s["labels"]))
        device = like.inputs.device if isinstance(like, TensorBatch) else torch.device("cpu")
        labels = s["labels"]
        return TensorBatch(s["inputs"].to(device), None if labels is None else labels.to(device))
