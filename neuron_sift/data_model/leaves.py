"""The sample-holding values of a parsed batch, and how their samples are cut and joined.

A leaf is the unit the loader works on: selecting and accumulating samples is done leaf
by leaf, so that one rule per kind of value (tensor, NumPy array, list of samples) covers
every nesting of containers. The containers above the leaves are ``BatchStructure``'s
business.
"""

from collections.abc import Callable, Sequence
from typing import Any, TypeGuard, Union

import torch

from neuron_sift.exceptions import UnsupportedDataFormatException

try:  # NumPy is optional: its arrays are handled when present.
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with every supported torch
    np = None  # type: ignore[assignment]

# What a leaf holds: samples along one axis of a tensor or array, or one sample per element.
LeafValue = Union[torch.Tensor, "np.ndarray", list, tuple]
# Positions of samples: Python ints (a ``range`` included) or an int64 tensor of them.
Indices = Sequence[int] | torch.Tensor


def is_array(x: Any) -> "TypeGuard[np.ndarray]":
    """Whether ``x`` is a NumPy array (False without NumPy, so callers need no import guard)."""
    return np is not None and isinstance(x, np.ndarray)


def rebuild_sequence(container: type, items: list[Any]) -> Any:
    """``items`` in a list/tuple of type ``container``, so the user gets their own type back.

    A ``namedtuple`` takes its fields as arguments, other sequence types an iterable.
    """
    make: Callable[..., Any] = container  # a bare ``type`` reads as ``object()`` to a type checker
    if issubclass(container, tuple):
        if hasattr(container, "_fields"):  # namedtuple
            return make(*items)
        return tuple(items) if container is tuple else make(items)
    return items if container is list else make(items)


def as_index_tensor(indices: Sequence[int]) -> torch.Tensor:
    """``indices`` as a CPU int64 tensor: built once per selection and shared by every tensor leaf."""
    return torch.as_tensor(indices if isinstance(indices, list) else list(indices), dtype=torch.long)


def _leaf_kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return "tensor"
    return "array" if is_array(x) else "list"


class Leaf:
    """One sample-holding value: a tensor or NumPy array with its samples along ``axis``,
    or a list/tuple with one sample per element (``axis`` is then 0 and unused).

    Leaves are never changed in place: ``select`` and ``concat`` return new ones, so a
    batch and the batches cut from it can share leaves safely.

    Attributes:
        value: the samples, in the type the user's batch had at this position.
        axis: the dimension of ``value`` that indexes samples (1 for a tensor batch read
            as indexed by feature, else 0).
    """

    __slots__ = ("value", "axis")

    def __init__(self, value: LeafValue, axis: int = 0):
        self.value = value
        self.axis = axis

    def __repr__(self) -> str:
        return f"Leaf({type(self.value).__name__} of {self.size()} samples, axis={self.axis})"

    def size(self) -> int:
        """The number of samples this leaf holds."""
        v = self.value
        if isinstance(v, (list, tuple)):
            return len(v)
        return int(v.shape[self.axis])

    def select(self, indices: Indices, index_tensor: torch.Tensor | None = None) -> "Leaf":
        """The samples at ``indices``, in that order.

        Args:
            indices: positions as Python ints, a ``range``, or an int64 tensor.
            index_tensor: the same positions as a CPU int64 tensor, when the caller has one:
                a batch of several tensor leaves builds it once instead of once per leaf.

        Returns:
            A new leaf of the same type. A ``range`` with step 1 of a tensor or array is a
            slice (a view, no copy): that is how a full batch is cut from pending samples
            without copying them.
        """
        v = self.value
        if isinstance(indices, range) and indices.step == 1 and not isinstance(v, (list, tuple)):
            start, stop = indices.start, max(indices.start, indices.stop)
            if isinstance(v, torch.Tensor):
                return Leaf(v.narrow(self.axis, start, stop - start), self.axis)
            return Leaf(v[(slice(None),) * self.axis + (slice(start, stop),)], self.axis)
        if isinstance(v, torch.Tensor):
            if index_tensor is not None:
                idx = index_tensor
            elif isinstance(indices, torch.Tensor):
                idx = indices.to(torch.long)
            else:
                idx = as_index_tensor(indices)
            if not (v.is_cpu and idx.is_cpu):
                idx = idx.to(v.device)
            return Leaf(v.index_select(self.axis, idx), self.axis)
        positions: Sequence[int] = indices.tolist() if isinstance(indices, torch.Tensor) else indices
        if is_array(v):
            return Leaf(np.take(v, list(positions), axis=self.axis), self.axis)
        return Leaf(rebuild_sequence(type(v), [v[i] for i in positions]), self.axis)

    @staticmethod
    def concat(parts: Sequence["Leaf"], path: str) -> "Leaf":
        """The samples of ``parts`` in order, as one leaf of the first part's type.

        Args:
            parts: leaves at the same position of consecutive batches (at least one).
            path: the field's position in the user's batch (``BatchStructure.leaf_paths``),
                named in errors so the user can find the field that changed.

        Raises:
            UnsupportedDataFormatException: the parts hold different kinds of values, or
                samples of different shapes.
        """
        first = parts[0]
        v = first.value
        if isinstance(v, torch.Tensor) and first.axis == 0:  # the common case, checked cheaply
            tail = v.shape[1:]
            if all(isinstance(p.value, torch.Tensor) and p.value.shape[1:] == tail for p in parts):
                return Leaf(torch.cat([p.value for p in parts]), 0)  # type: ignore[misc]
        for p in parts[1:]:
            if _leaf_kind(p.value) != _leaf_kind(v):
                raise UnsupportedDataFormatException(
                    f"cannot accumulate samples of field {path or '<batch>'}: a {type(p.value).__name__} after a "
                    f"{type(v).__name__} in an earlier batch; every source batch must have the same field types"
                )
        if isinstance(v, torch.Tensor) or is_array(v):
            ref = list(v.shape)
            want = ref[: first.axis] + ref[first.axis + 1 :]
            for p in parts[1:]:
                other = list(p.value.shape)  # type: ignore[union-attr]
                del other[first.axis]
                if other != want:
                    raise UnsupportedDataFormatException(
                        f"cannot accumulate samples of field {path or '<batch>'}: per-sample shape {tuple(other)} "
                        f"differs from {tuple(want)} in an earlier batch; pad every batch to the same shape "
                        "or pass batch_transforms"
                    )
            values: list[Any] = [p.value for p in parts]
            if isinstance(v, torch.Tensor):
                return Leaf(torch.cat(values, dim=first.axis), first.axis)
            return Leaf(np.concatenate(values, axis=first.axis), first.axis)
        items: list[Any] = []
        for p in parts:
            items.extend(p.value)
        return Leaf(rebuild_sequence(type(v), items), first.axis)
