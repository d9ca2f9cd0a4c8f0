"""``DefaultSiftingBatch``: a user's batch as the default handling parsed it.

A tree of containers (``structure.BatchStructure``) over leaves that hold the samples
along one axis (``leaves.Leaf``). Selecting, splitting and joining work leaf by leaf and
keep the structure object, so every batch cut from one source batch, and every joined one,
shares it, and ``to_user`` rebuilds the user's own containers. Apart from the parsing
(``default_batch.DefaultBatchTransform``): the pending stores and the checkpoint build
and cut these batches without parsing anything.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.leaves import Indices, Leaf, as_index_tensor
from neuron_sift.data_model.structure import BatchStructure
from neuron_sift.exceptions import UnsupportedDataFormatException

__all__ = ["DefaultSiftingBatch"]


class DefaultSiftingBatch(SiftingBatch):
    """A parsed user batch: a ``BatchStructure`` of containers over sample-holding leaves.

    Selection and joining work leaf by leaf and keep the structure object, so batches cut
    from one source batch, and joined ones, share it. Other modules (device staging,
    checkpoints) build batches from ``structure`` and new ``leaves`` through this API.

    Args:
        structure: the containers, fields and leaf numbering, shared with the batch the
            leaves came from.
        leaves: the sample-holding values, in ``structure``'s leaf order; the batch keeps
            the list, so it must not be changed afterwards.
        size: the number of samples every leaf holds.
    """

    def __init__(self, structure: BatchStructure, leaves: list[Leaf], size: int):
        self._structure = structure
        self._leaves = leaves
        self._size = size

    @property
    def structure(self) -> BatchStructure:
        """Fields and nesting of the user's batch; what batches must share to be joined."""
        return self._structure

    @property
    def leaves(self) -> list[Leaf]:
        """The sample-holding values in leaf order (read only: leaves are shared between batches)."""
        return self._leaves

    def with_leaves(self, leaves: list[Leaf], size: int) -> "DefaultSiftingBatch":
        """A batch of this structure over other ``leaves`` of ``size`` samples each."""
        return DefaultSiftingBatch(self._structure, leaves, size)

    def __len__(self) -> int:
        return self._size

    def select(self, indices: Indices) -> "DefaultSiftingBatch":
        """The samples at ``indices``: Python ints, a ``range``, or an int64 tensor of indices."""
        if isinstance(indices, range):
            return DefaultSiftingBatch(self._structure, [leaf.select(indices) for leaf in self._leaves], len(indices))
        index_tensor = None
        if isinstance(indices, torch.Tensor):
            index_tensor = indices
        elif any(isinstance(leaf.value, torch.Tensor) for leaf in self._leaves):
            indices = list(indices)
            index_tensor = as_index_tensor(indices)
        else:
            indices = list(indices)
        leaves = [leaf.select(indices, index_tensor) for leaf in self._leaves]
        n = index_tensor.shape[0] if index_tensor is not None else len(indices)
        return DefaultSiftingBatch(self._structure, leaves, n)

    def split_at(self, n: int) -> tuple["DefaultSiftingBatch", "DefaultSiftingBatch"]:
        """The first ``n`` samples and the rest (views of tensors and arrays, no copy)."""
        firsts, rests = [], []
        for leaf in self._leaves:
            v = leaf.value
            if isinstance(v, torch.Tensor):
                a, b = v.tensor_split([n], dim=leaf.axis)
                firsts.append(Leaf(a, leaf.axis))
                rests.append(Leaf(b, leaf.axis))
            else:
                firsts.append(leaf.select(range(n)))
                rests.append(leaf.select(range(n, leaf.size())))
        return (
            DefaultSiftingBatch(self._structure, firsts, n),
            DefaultSiftingBatch(self._structure, rests, self._size - n),
        )

    def concat(self, others: Sequence[SiftingBatch]) -> "DefaultSiftingBatch":
        structure = self._structure
        parts: list[DefaultSiftingBatch] = [self]
        for o in others:
            if not isinstance(o, DefaultSiftingBatch) or not structure.same_shape(o._structure):
                raise UnsupportedDataFormatException(
                    "cannot accumulate batches of different structure; every source batch must have the same fields"
                )
            parts.append(o)
        paths = structure.leaf_paths()
        leaves = [Leaf.concat([p._leaves[i] for p in parts], paths[i]) for i in range(len(self._leaves))]
        return DefaultSiftingBatch(structure, leaves, sum(p._size for p in parts))

    def to_user(self) -> Any:
        """The batch in the user's own containers and types."""
        return self._structure.build(self._leaves)

    # A loss written for smart_sifting may read ``transformed_batch`` as the batch itself
    # (``[t.to(device) for t in transformed_batch]``): iterate and index the user's view.

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_user())

    def __getitem__(self, key: Any) -> Any:
        return self.to_user()[key]
