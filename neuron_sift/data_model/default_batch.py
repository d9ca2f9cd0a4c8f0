"""Default handling of tensor, list, tuple and dict batches (nested too), no transform needed.

A batch is parsed once into a tree: containers (dicts, lists/tuples of fields) and
leaves that hold samples along one axis (tensors, NumPy arrays, or lists whose elements
are the samples). Selection and accumulation work leaf by leaf, and the tree rebuilds the
user's own types (including ``namedtuple`` and ``Mapping`` subclasses such as
Hugging Face's ``BatchEncoding``).

Which axis of a list or tensor holds the samples is decided on the first batch and then
reused (for lists nested in a batch too), so a short last batch cannot flip it:
- a ``dict`` holds fields; each field holds samples along its dimension 0;
- a ``list``/``tuple`` either holds fields (what ``default_collate`` makes of tuple
  datasets: "dimension 1" is the sample) or samples ("dimension 0"). When the source
  loader's batch size is known, the dimension whose size equals it wins; if both or
  neither do, ``UnsupportedDataFormatException`` says so and ``batch_format_index``
  (0 = indexed by sample, 1 = indexed by feature) settles it;
- a bare tensor (or NumPy array) holds samples along dimension 0, unless
  ``batch_format_index=1``: what a DataLoader makes of a tensor dataset, square batches
  (batch size equal to the feature count) included. The ambiguity exists only for lists
  and tuples, whose elements may be samples or fields.
"""

import numbers
from collections.abc import Mapping
from typing import Any, List, Optional, Sequence, Tuple

import torch

from neuron_sift.data_model.data_model_interface import SiftingBatch, SiftingBatchTransform
from neuron_sift.exceptions import UnsupportedDataFormatException

try:  # NumPy is optional: its arrays are handled when present.
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with every supported torch
    _np = None

SAMPLE_MAJOR = 0
FEATURE_MAJOR = 1


def _is_array(x: Any) -> bool:
    return _np is not None and isinstance(x, _np.ndarray)


def _leading_size(x: Any) -> Optional[int]:
    """Size of the first dimension of something indexable by sample, else None."""
    if isinstance(x, torch.Tensor) or _is_array(x):
        return int(x.shape[0]) if x.ndim >= 1 else None
    if isinstance(x, (list, tuple)):
        return len(x)
    if isinstance(x, Mapping):
        sizes = {_leading_size(v) for v in x.values()}
        return sizes.pop() if len(sizes) == 1 else None
    return None


def _array_row_counts(x: Any) -> List[int]:
    """Dimension-0 sizes of every tensor/array nested anywhere in ``x``."""
    if isinstance(x, torch.Tensor) or _is_array(x):
        return [int(x.shape[0])] if x.ndim >= 1 else []
    if isinstance(x, Mapping):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        out: List[int] = []
        for e in x:
            out.extend(_array_row_counts(e))
        return out
    return []


def _holds_samples(x: Any, n: int) -> bool:
    """Whether ``x`` can be read as a field holding ``n`` samples (recursively)."""
    if isinstance(x, torch.Tensor) or _is_array(x):
        return x.ndim >= 1 and int(x.shape[0]) == n
    if isinstance(x, Mapping):
        return len(x) > 0 and all(_holds_samples(v, n) for v in x.values())
    if isinstance(x, (list, tuple)):
        return len(x) == n or (len(x) > 0 and all(_holds_samples(e, n) for e in x))
    return False


def _dim1_size(batch: Any) -> Optional[int]:
    """Samples per field when a list/tuple is read as fields ("dimension 1"), or a tensor's dim 1.

    Candidates come from the tensors nested inside (their dimension 0) and from the
    elements' lengths; the first candidate that every element holds wins.
    """
    if isinstance(batch, torch.Tensor) or _is_array(batch):
        return int(batch.shape[1]) if batch.ndim >= 2 else None
    if len(batch) == 0:
        return None
    rows = sorted(set(_array_row_counts(batch)))
    lengths = sorted({_leading_size(e) for e in batch} - {None} - set(rows))
    for candidate in rows + lengths:
        if all(_holds_samples(e, candidate) for e in batch):
            return candidate
    return None


def _rebuild_sequence(template: Any, items: List[Any]) -> Any:
    if isinstance(template, tuple) and hasattr(template, "_fields"):  # namedtuple
        return type(template)(*items)
    if isinstance(template, tuple):
        return tuple(items) if type(template) is tuple else type(template)(items)
    return items if type(template) is list else type(template)(items)


def _rebuild_mapping(template: Mapping, items: dict) -> Any:
    if type(template) is dict:
        return items
    try:
        return type(template)(items)
    except Exception as exc:  # a Mapping type we cannot rebuild: say so, do not change its type silently
        raise UnsupportedDataFormatException(
            f"cannot rebuild a batch of type {type(template)} from a dict; pass batch_transforms"
        ) from exc


def _leaf_kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return "tensor"
    return "array" if _is_array(x) else "list"


def _index_tensor(indices: Sequence[int]) -> torch.Tensor:
    return torch.as_tensor(indices if isinstance(indices, list) else list(indices), dtype=torch.long)


class _Leaf:
    """One sample-holding value: a tensor/array (samples along ``axis``) or a list of samples."""

    __slots__ = ("value", "axis")

    def __init__(self, value: Any, axis: int = 0):
        self.value = value
        self.axis = axis

    def size(self) -> int:
        if isinstance(self.value, (list, tuple)):
            return len(self.value)
        return int(self.value.shape[self.axis])

    def select(self, indices: Sequence[int], index_tensor: Optional[torch.Tensor] = None) -> "_Leaf":
        """The samples at ``indices``; ``index_tensor`` is the same as a CPU int64 tensor, if at hand.

        A ``range`` with step 1 of a tensor or array is a slice (a view, no copy): that is
        how the accumulator cuts a full batch from its pending samples.
        """
        v = self.value
        if isinstance(indices, range) and indices.step == 1 and not isinstance(v, (list, tuple)):
            start, stop = indices.start, max(indices.start, indices.stop)
            if isinstance(v, torch.Tensor):
                return _Leaf(v.narrow(self.axis, start, stop - start), self.axis)
            return _Leaf(v[(slice(None),) * self.axis + (slice(start, stop),)], self.axis)
        if isinstance(v, torch.Tensor):
            idx = index_tensor if index_tensor is not None else _index_tensor(indices)
            if not (v.is_cpu and idx.is_cpu):
                idx = idx.to(v.device)
            return _Leaf(v.index_select(self.axis, idx), self.axis)
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        if _is_array(v):
            return _Leaf(_np.take(v, list(indices), axis=self.axis), self.axis)
        return _Leaf(_rebuild_sequence(v, [v[i] for i in indices]), self.axis)

    @staticmethod
    def concat(parts: Sequence["_Leaf"], path: str) -> "_Leaf":
        """The samples of ``parts`` in order; ``path`` names the field in errors."""
        first = parts[0]
        v = first.value
        if isinstance(v, torch.Tensor) and first.axis == 0:  # the common case, checked cheaply
            tail = v.shape[1:]
            if all(isinstance(p.value, torch.Tensor) and p.value.shape[1:] == tail for p in parts):
                return _Leaf(torch.cat([p.value for p in parts]), 0)
        for p in parts[1:]:
            if _leaf_kind(p.value) != _leaf_kind(v):
                raise UnsupportedDataFormatException(
                    f"cannot accumulate samples of field {path or '<batch>'}: a {type(p.value).__name__} after a "
                    f"{type(v).__name__} in an earlier batch; every source batch must have the same field types"
                )
        if isinstance(v, torch.Tensor) or _is_array(v):
            ref = list(v.shape)
            for p in parts[1:]:
                other = list(p.value.shape)
                del other[first.axis]
                want = ref[: first.axis] + ref[first.axis + 1 :]
                if other != want:
                    raise UnsupportedDataFormatException(
                        f"cannot accumulate samples of field {path or '<batch>'}: per-sample shape {tuple(other)} "
                        f"differs from {tuple(want)} in an earlier batch; pad every batch to the same shape "
                        "or pass batch_transforms"
                    )
            if isinstance(v, torch.Tensor):
                return _Leaf(torch.cat([p.value for p in parts], dim=first.axis), first.axis)
            return _Leaf(_np.concatenate([p.value for p in parts], axis=first.axis), first.axis)
        items: List[Any] = []
        for p in parts:
            items.extend(p.value)
        return _Leaf(_rebuild_sequence(v, items), first.axis)


class DefaultSiftingBatch(SiftingBatch):
    """A parsed user batch: a tree of containers over sample-holding leaves."""

    def __init__(self, spec: Any, leaves: List[_Leaf], size: int, structure: Any = None):
        self._spec = spec
        self._leaves = leaves
        self._size = size
        self._structure = structure  # _spec_structure(spec), computed when first needed

    @property
    def structure(self) -> Any:
        """Field names and nesting without the user's values: what batches must share to be joined."""
        if self._structure is None:
            self._structure = _spec_structure(self._spec)
        return self._structure

    def __len__(self) -> int:
        return self._size

    def select(self, indices: Sequence[int]) -> "DefaultSiftingBatch":
        """The samples at ``indices``: Python ints, a ``range``, or an int64 tensor of indices."""
        if isinstance(indices, range):
            leaves = [leaf.select(indices) for leaf in self._leaves]
            return DefaultSiftingBatch(self._spec, leaves, len(indices), self._structure)
        index_tensor = None
        if isinstance(indices, torch.Tensor):
            index_tensor = indices
        elif any(isinstance(leaf.value, torch.Tensor) for leaf in self._leaves):
            indices = list(indices)
            index_tensor = _index_tensor(indices)
        else:
            indices = list(indices)
        leaves = [leaf.select(indices, index_tensor) for leaf in self._leaves]
        n = index_tensor.shape[0] if index_tensor is not None else len(indices)
        return DefaultSiftingBatch(self._spec, leaves, n, self._structure)

    def split_at(self, n: int) -> Tuple["DefaultSiftingBatch", "DefaultSiftingBatch"]:
        """The first ``n`` samples and the rest (views of tensors and arrays, no copy)."""
        firsts, rests = [], []
        for leaf in self._leaves:
            v = leaf.value
            if isinstance(v, torch.Tensor):
                a, b = v.tensor_split([n], dim=leaf.axis)
                firsts.append(_Leaf(a, leaf.axis))
                rests.append(_Leaf(b, leaf.axis))
            else:
                firsts.append(leaf.select(range(n)))
                rests.append(leaf.select(range(n, leaf.size())))
        return (
            DefaultSiftingBatch(self._spec, firsts, n, self._structure),
            DefaultSiftingBatch(self._spec, rests, self._size - n, self._structure),
        )

    def concat(self, others: Sequence["DefaultSiftingBatch"]) -> "DefaultSiftingBatch":
        parts = [self] + list(others)
        structure = self.structure
        for o in parts[1:]:
            if not isinstance(o, DefaultSiftingBatch) or (o.structure is not structure and o.structure != structure):
                raise UnsupportedDataFormatException(
                    "cannot accumulate batches of different structure; every source batch must have the same fields"
                )
        paths = _leaf_paths(self._spec)
        leaves = [_Leaf.concat([p._leaves[i] for p in parts], paths[i]) for i in range(len(self._leaves))]
        return DefaultSiftingBatch(self._spec, leaves, sum(p._size for p in parts), structure)

    def to_user(self) -> Any:
        return _build(self._spec, self._leaves)

    # A loss written for smart_sifting may read ``transformed_batch`` as the batch itself
    # (``[t.to(device) for t in transformed_batch]``): iterate and index the user's view.

    def __iter__(self):
        return iter(self.to_user())

    def __getitem__(self, key: Any) -> Any:
        return self.to_user()[key]


# A spec is ("leaf", i) | ("map", template, keys, [child specs]) | ("seq", template, [child specs])


def _build(spec: Any, leaves: List[_Leaf]) -> Any:
    kind = spec[0]
    if kind == "leaf":
        return leaves[spec[1]].value
    if kind == "map":
        _, template, keys, children = spec
        return _rebuild_mapping(template, {k: _build(c, leaves) for k, c in zip(keys, children)})
    _, template, children = spec
    return _rebuild_sequence(template, [_build(c, leaves) for c in children])


def _spec_structure(spec: Any) -> Any:
    """The shape of a spec (field names and nesting), without the user's values."""
    kind = spec[0]
    if kind == "leaf":
        return ("leaf", spec[1])
    if kind == "map":
        return ("map", tuple(spec[2]), tuple(_spec_structure(c) for c in spec[3]))
    return ("seq", tuple(_spec_structure(c) for c in spec[2]))


def _leaf_paths(spec: Any, prefix: str = "") -> List[str]:
    kind = spec[0]
    if kind == "leaf":
        return [prefix]
    if kind == "map":
        out: List[str] = []
        for k, c in zip(spec[2], spec[3]):
            out.extend(_leaf_paths(c, f"{prefix}[{k!r}]"))
        return out
    out = []
    for i, c in enumerate(spec[2]):
        out.extend(_leaf_paths(c, f"{prefix}[{i}]"))
    return out


def _tensor_fields(batch: Sequence[Any]) -> Optional[DefaultSiftingBatch]:
    """The common case parsed directly: a list/tuple of tensors that share dimension 0.

    The same tree the general parser builds, without its search for the sample count.
    """
    n = None
    for e in batch:
        if not isinstance(e, torch.Tensor) or e.ndim == 0 or (n is not None and e.shape[0] != n):
            return None
        n = e.shape[0]
    if n is None:
        return None
    leaves = [_Leaf(e) for e in batch]
    structure = _FIELDS_STRUCTURE.get(len(leaves))
    if structure is None:
        structure = _FIELDS_STRUCTURE[len(leaves)] = ("seq", tuple(("leaf", i) for i in range(len(leaves))))
    return DefaultSiftingBatch(("seq", batch, [("leaf", i) for i in range(len(leaves))]), leaves, int(n), structure)


# The structure of a list/tuple of k tensor fields, one object per k: joined batches compare by identity.
_FIELDS_STRUCTURE: dict = {}


class DefaultBatchTransform(SiftingBatchTransform):
    """Parses tensors, lists, tuples and dicts (nested) without user code.

    What ``SiftingDataloader`` uses when ``batch_transforms`` is None; rebuilds your own
    container types. Which dimension of a list or tuple holds the samples is decided on the
    first batch and kept, so a short last batch cannot flip it.

    Args:
        nominal_batch_size: the source loader's batch size when known; the dimension of a
            list or tuple whose size equals it holds the samples.
        batch_format_index: ``0`` (the batch is indexed by sample), ``1`` (indexed by
            feature; a bare tensor is then split along dimension 1) or None to detect.

    Raises:
        UnsupportedDataFormatException: ``batch_format_index`` is not 0, 1 or None; and, from
            ``transform``, a batch that cannot be split (see the docs' Batches page).
    """

    def __init__(self, nominal_batch_size: Optional[int] = None, batch_format_index: Optional[int] = None):
        if batch_format_index is not None and (
            isinstance(batch_format_index, bool)
            or not isinstance(batch_format_index, numbers.Integral)
            or batch_format_index not in (SAMPLE_MAJOR, FEATURE_MAJOR)
        ):
            raise UnsupportedDataFormatException(
                f"batch_format_index must be 0 (batch indexed by sample), 1 (indexed by feature) or None, "
                f"got {batch_format_index!r}"
            )
        if batch_format_index is not None:
            batch_format_index = int(batch_format_index)  # e.g. numpy ints: used as an axis below
        self.nominal_batch_size = nominal_batch_size
        self.batch_format_index = batch_format_index
        self._top_format: Optional[int] = batch_format_index
        self._inner_formats: dict = {}  # path of a nested list/tuple -> format first seen there

    # -- parsing -----------------------------------------------------------------------

    def transform(self, batch: Any) -> DefaultSiftingBatch:
        leaves: List[_Leaf] = []
        if isinstance(batch, Mapping):
            n = self._mapping_size(batch)
            spec = self._parse_inner(batch, n, leaves, "")
            return DefaultSiftingBatch(spec, leaves, n)
        if isinstance(batch, torch.Tensor) or _is_array(batch):
            if batch.ndim == 0:
                raise UnsupportedDataFormatException(
                    f"Unable to index the batch of type {type(batch)}: it is a 0-dimensional value"
                )
        elif not isinstance(batch, (list, tuple)):
            raise UnsupportedDataFormatException(
                f"Batches of type {type(batch)} are not supported by default. "
                "Pass batch_transforms=<your SiftingBatchTransform> to SiftingDataloader."
            )
        fmt = self._decide_top_format(batch)
        if isinstance(batch, torch.Tensor) or _is_array(batch):
            if fmt == FEATURE_MAJOR and batch.ndim < 2:
                raise UnsupportedDataFormatException(
                    f"batch_format_index=1 needs a tensor with at least 2 dimensions, got shape {tuple(batch.shape)}"
                )
            leaf = _Leaf(batch, axis=fmt)
            leaves.append(leaf)
            return DefaultSiftingBatch(("leaf", 0), leaves, leaf.size())
        if fmt == SAMPLE_MAJOR:
            leaves.append(_Leaf(batch))
            return DefaultSiftingBatch(("leaf", 0), leaves, len(batch))
        fields_of_tensors = _tensor_fields(batch)  # what default_collate makes of tuple datasets
        if fields_of_tensors is not None:
            return fields_of_tensors
        n = _dim1_size(batch)
        if n is None:
            raise UnsupportedDataFormatException(
                f"Unable to index the batch of type {type(batch)} by feature: its elements do not share one "
                "sample count (sizes "
                f"{[_leading_size(e) for e in batch]})"
            )
        children = [self._parse_inner(e, n, leaves, f"[{i}]") for i, e in enumerate(batch)]
        return DefaultSiftingBatch(("seq", batch, children), leaves, n)

    def _mapping_size(self, batch: Mapping) -> int:
        if len(batch) == 0:
            raise UnsupportedDataFormatException(f"Unable to index the batch of type {type(batch)}: it has no fields")
        arrays = set(_array_row_counts(batch))
        if len(arrays) == 1:  # tensors anywhere inside agree: that is the sample count
            return arrays.pop()
        sizes = {}
        for k, v in batch.items():
            s = _leading_size(v)
            if s is None:
                raise UnsupportedDataFormatException(
                    f"Unable to index the batch of type {type(batch)}: field {k!r} of type {type(v)} "
                    "has no sample dimension"
                )
            sizes[k] = s
        if len(set(sizes.values())) != 1:
            raise UnsupportedDataFormatException(
                f"Unable to index the batch of type {type(batch)}: its fields hold different numbers of samples {sizes}"
            )
        return next(iter(sizes.values()))

    def _decide_top_format(self, batch: Any) -> int:
        if self._top_format is not None:
            return self._top_format
        is_tensor = not isinstance(batch, (list, tuple))
        if is_tensor:
            self._top_format = SAMPLE_MAJOR
            return SAMPLE_MAJOR
        d0 = len(batch)
        d1 = _dim1_size(batch)
        b = self.nominal_batch_size
        fmt: Optional[int] = None
        if b is not None:
            m0 = d0 == b
            m1 = len(batch) > 0 and all(_holds_samples(e, b) for e in batch)
            if m0 and m1:
                raise UnsupportedDataFormatException(
                    "Both dimension 0 and dimension 1 match batch size "
                    f"({b}); pass batch_format_index=0 (indexed by sample) or 1 (indexed by feature) "
                    "to SiftingDataloader"
                )
            if m0:
                fmt = SAMPLE_MAJOR
            elif m1:
                fmt = FEATURE_MAJOR
        if fmt is None:
            # Batch size unknown, or this first batch is short (dataset smaller than one batch).
            if d1 is not None and d1 == d0:
                raise UnsupportedDataFormatException(
                    "Both dimension 0 and dimension 1 match batch size "
                    f"({d0}); pass batch_format_index=0 (indexed by sample) or 1 (indexed by feature) "
                    "to SiftingDataloader"
                )
            else:
                fmt = FEATURE_MAJOR if d1 is not None else SAMPLE_MAJOR
            size = d0 if fmt == SAMPLE_MAJOR else d1
            if b is not None and size >= b:
                raise UnsupportedDataFormatException(
                    f"Batch size {b} does not match dimension 0 or dimension 1 sizes "
                    f"(dimension 0: {d0}, dimension 1: {d1}); pass batch_transforms"
                )
        self._top_format = fmt
        return fmt

    def _parse_inner(self, value: Any, n: int, leaves: List[_Leaf], path: str) -> Any:
        if isinstance(value, Mapping):
            keys = list(value.keys())
            children = [self._parse_inner(value[k], n, leaves, f"{path}[{k!r}]") for k in keys]
            return ("map", value, keys, children)
        if isinstance(value, torch.Tensor) or _is_array(value):
            if value.ndim == 0 or value.shape[0] != n:
                shape = tuple(value.shape)
                raise UnsupportedDataFormatException(
                    f"Batch size {n} does not match dimension 0 of field {path or '<batch>'} with shape {shape}"
                )
            leaves.append(_Leaf(value))
            return ("leaf", len(leaves) - 1)
        if isinstance(value, (list, tuple)):
            d1 = _dim1_size(value)
            as_samples = len(value) == n
            as_fields = len(value) > 0 and all(_holds_samples(e, n) for e in value)
            known = self._inner_formats.get(path)
            if as_samples and as_fields and known is not None:
                # Ambiguous only now (a short last batch, n x n): keep what an earlier batch showed.
                as_samples, as_fields = known == SAMPLE_MAJOR, known == FEATURE_MAJOR
            if as_samples and as_fields:
                # Nested and ambiguous (n elements that each hold n samples): read it as fields,
                # which is what default_collate makes of nested sequences; a list of samples
                # inside a batch holds samples that are not themselves batched (strings, objects).
                as_samples = False
            if as_samples:
                self._inner_formats[path] = SAMPLE_MAJOR
                leaves.append(_Leaf(value))
                return ("leaf", len(leaves) - 1)
            if as_fields:
                self._inner_formats[path] = FEATURE_MAJOR
                children = [self._parse_inner(e, n, leaves, f"{path}[{i}]") for i, e in enumerate(value)]
                return ("seq", value, children)
            raise UnsupportedDataFormatException(
                f"Batch size {n} does not match dimension 0 or dimension 1 sizes of field {path} "
                f"(dimension 0: {len(value)}, dimension 1: {d1})"
            )
        raise UnsupportedDataFormatException(
            f"Unable to index the batch of type {type(value)} at field {path or '<batch>'}: "
            "it has no sample dimension; pass batch_transforms"
        )

    # -- back to the user's format --------------------------------------------------------

    def reverse_transform(self, sifting_batch: DefaultSiftingBatch) -> Any:
        return sifting_batch.to_user()
