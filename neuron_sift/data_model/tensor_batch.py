"""``TensorBatch``: samples along dimension 0 of ``inputs`` (and ``labels``)."""

from collections.abc import Sequence

import torch

from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.exceptions import UnsupportedDataFormatException


def _index_tensor(indices, device: torch.device) -> torch.Tensor:
    if isinstance(indices, torch.Tensor):
        return indices.to(device=device, dtype=torch.long)
    return torch.as_tensor(list(indices), dtype=torch.long, device=device)


class TensorBatch(SiftingBatch):
    """A ``SiftingBatch`` of tensors whose first dimension is the sample.

    Selection is one ``index_select`` and accumulation one ``torch.cat``, on the tensors'
    own device; a checkpoint can save its pending samples.

    Args:
        inputs: a tensor with the samples along dimension 0.
        labels: a tensor with as many rows, or None.

    Raises:
        UnsupportedDataFormatException: ``inputs`` or ``labels`` is not a tensor with a
            sample dimension, or their row counts differ; from ``concat``, a batch of
            another type, with and without labels mixed, or a different per-sample shape
            (pad to a fixed shape).
    """

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor | None = None):
        if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0:
            raise UnsupportedDataFormatException(
                f"TensorBatch.inputs must be a tensor with a sample dimension 0, got {type(inputs).__name__}"
            )
        if labels is not None:
            if not isinstance(labels, torch.Tensor) or labels.dim() == 0:
                raise UnsupportedDataFormatException(
                    f"TensorBatch.labels must be a tensor with a sample dimension 0 or None, got {type(labels).__name__}"
                )
            if labels.shape[0] != inputs.shape[0]:
                raise UnsupportedDataFormatException(
                    f"TensorBatch has {inputs.shape[0]} inputs but {labels.shape[0]} labels"
                )
        self.inputs = inputs
        self.labels = labels

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def select(self, indices: Sequence[int]) -> "TensorBatch":
        idx = _index_tensor(indices, self.inputs.device)
        labels = None if self.labels is None else self.labels.index_select(0, idx.to(self.labels.device))
        return TensorBatch(self.inputs.index_select(0, idx), labels)

    def concat(self, others: Sequence[SiftingBatch]) -> "TensorBatch":
        parts: list[TensorBatch] = [self]
        for other in others:
            if not isinstance(other, TensorBatch):
                raise UnsupportedDataFormatException(f"cannot concatenate TensorBatch with {type(other).__name__}")
            if (self.labels is None) != (other.labels is None):
                raise UnsupportedDataFormatException("cannot concatenate TensorBatches with and without labels")
            if other.inputs.shape[1:] != self.inputs.shape[1:]:
                raise UnsupportedDataFormatException(
                    f"cannot accumulate samples of shape {tuple(other.inputs.shape[1:])} with samples of shape "
                    f"{tuple(self.inputs.shape[1:])}; pad batches to a fixed shape"
                )
            if self.labels is not None:
                assert other.labels is not None  # checked above: both have labels or neither has
                if other.labels.shape[1:] != self.labels.shape[1:]:
                    raise UnsupportedDataFormatException(
                        f"cannot accumulate labels of per-sample shape {tuple(other.labels.shape[1:])} with labels "
                        f"of shape {tuple(self.labels.shape[1:])}; pad batches to a fixed shape"
                    )
            parts.append(other)
        inputs = torch.cat([p.inputs for p in parts])
        # Every part has labels when this batch has (checked above): the filter drops nothing.
        labels = None if self.labels is None else torch.cat([p.labels for p in parts if p.labels is not None])
        return TensorBatch(inputs, labels)

    def __repr__(self) -> str:
        return f"TensorBatch(inputs={tuple(self.inputs.shape)}, labels={None if self.labels is None else tuple(self.labels.shape)})"
