"""``ListBatch``: samples as Python lists (elements may be anything: tensors, strings, tuples)."""

from collections.abc import Sequence
from typing import Any

from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.exceptions import UnsupportedDataFormatException


class ListBatch(SiftingBatch):
    """A ``SiftingBatch`` of Python lists: ``inputs[i]`` and ``labels[i]`` belong to sample i.

    For transforms whose samples are not tensors of one shape (strings, variable-length
    sequences, tuples); a checkpoint can save its pending samples.

    Args:
        inputs: one element per sample (any objects).
        labels: one element per sample, or None.

    Raises:
        UnsupportedDataFormatException: ``inputs`` or ``labels`` is not a list or tuple, or
            their lengths differ; from ``concat``, a batch of another type or with and
            without labels mixed.
    """

    def __init__(self, inputs: list[Any], labels: list[Any] | None = None):
        if not isinstance(inputs, (list, tuple)):
            raise UnsupportedDataFormatException(
                f"ListBatch.inputs must be a list with one element per sample, got {type(inputs).__name__}"
            )
        if labels is not None:
            if not isinstance(labels, (list, tuple)):
                raise UnsupportedDataFormatException(
                    f"ListBatch.labels must be a list or None, got {type(labels).__name__}"
                )
            if len(labels) != len(inputs):
                raise UnsupportedDataFormatException(f"ListBatch has {len(inputs)} inputs but {len(labels)} labels")
        self.inputs = list(inputs)
        self.labels = None if labels is None else list(labels)

    def __len__(self) -> int:
        return len(self.inputs)

    def select(self, indices: Sequence[int]) -> "ListBatch":
        idx = list(indices)
        labels = None if self.labels is None else [self.labels[i] for i in idx]
        return ListBatch([self.inputs[i] for i in idx], labels)

    def concat(self, others: Sequence[SiftingBatch]) -> "ListBatch":
        inputs = list(self.inputs)
        labels = None if self.labels is None else list(self.labels)
        for other in others:
            if not isinstance(other, ListBatch):
                raise UnsupportedDataFormatException(f"cannot concatenate ListBatch with {type(other).__name__}")
            if (labels is None) != (other.labels is None):
                raise UnsupportedDataFormatException("cannot concatenate ListBatches with and without labels")
            inputs.extend(other.inputs)
            if labels is not None:
                assert other.labels is not None  # checked above: both have labels or neither has
                labels.extend(other.labels)
        return ListBatch(inputs, labels)

    def __repr__(self) -> str:
        return f"ListBatch(n={len(self)}, labels={'yes' if self.labels is not None else 'no'})"
