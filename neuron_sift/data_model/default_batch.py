"""Default handling of tensor, list, tuple and dict batches (nested too), no transform needed.

A batch is parsed once into a tree: containers (dicts, lists/tuples of fields) and
leaves that hold samples along one axis (tensors, NumPy arrays, or lists whose elements
are the samples): a ``DefaultSiftingBatch`` (``default_sifting_batch.py``, re-exported
here). Selection and accumulation work leaf by leaf, and the tree rebuilds the user's own
types (including ``namedtuple`` and ``Mapping`` subclasses such as Hugging Face's
``BatchEncoding``). This module is the parsing.

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
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from neuron_sift.data_model.data_model_interface import SiftingBatch, SiftingBatchTransform
from neuron_sift.data_model.default_sifting_batch import DefaultSiftingBatch
from neuron_sift.data_model.leaves import Leaf, is_array
from neuron_sift.data_model.structure import BatchStructure
from neuron_sift.exceptions import UnsupportedDataFormatException

__all__ = ["DefaultBatchTransform", "DefaultSiftingBatch", "FEATURE_MAJOR", "SAMPLE_MAJOR"]

SAMPLE_MAJOR = 0
FEATURE_MAJOR = 1


def _leading_size(x: Any) -> int | None:
    """Size of the first dimension of something indexable by sample, else None."""
    if isinstance(x, torch.Tensor) or is_array(x):
        return int(x.shape[0]) if x.ndim >= 1 else None
    if isinstance(x, (list, tuple)):
        return len(x)
    if isinstance(x, Mapping):
        sizes = {_leading_size(v) for v in x.values()}
        return sizes.pop() if len(sizes) == 1 else None
    return None


def _array_row_counts(x: Any) -> list[int]:
    """Dimension-0 sizes of every tensor/array nested anywhere in ``x``."""
    if isinstance(x, torch.Tensor) or is_array(x):
        return [int(x.shape[0])] if x.ndim >= 1 else []
    if isinstance(x, Mapping):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        out: list[int] = []
        for e in x:
            out.extend(_array_row_counts(e))
        return out
    return []


def _holds_samples(x: Any, n: int) -> bool:
    """Whether ``x`` can be read as a field holding ``n`` samples (recursively)."""
    if isinstance(x, torch.Tensor) or is_array(x):
        return x.ndim >= 1 and int(x.shape[0]) == n
    if isinstance(x, Mapping):
        return len(x) > 0 and all(_holds_samples(v, n) for v in x.values())
    if isinstance(x, (list, tuple)):
        return len(x) == n or (len(x) > 0 and all(_holds_samples(e, n) for e in x))
    return False


def _dim1_size(batch: Any) -> int | None:
    """Samples per field when a list/tuple is read as fields ("dimension 1"), or a tensor's dim 1.

    Candidates come from the tensors nested inside (their dimension 0) and from the
    elements' lengths; the first candidate that every element holds wins.
    """
    if isinstance(batch, torch.Tensor) or is_array(batch):
        return int(batch.shape[1]) if batch.ndim >= 2 else None
    if len(batch) == 0:
        return None
    rows = sorted(set(_array_row_counts(batch)))
    lengths = sorted({s for e in batch if (s := _leading_size(e)) is not None} - set(rows))
    for candidate in rows + lengths:
        if all(_holds_samples(e, candidate) for e in batch):
            return candidate
    return None


def _tensor_fields(batch: Sequence[Any]) -> DefaultSiftingBatch | None:
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
    return DefaultSiftingBatch(BatchStructure.fields(type(batch), len(batch)), [Leaf(e) for e in batch], int(n))


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

    def __init__(self, nominal_batch_size: int | None = None, batch_format_index: int | None = None):
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
        self._top_format: int | None = batch_format_index
        self._inner_formats: dict = {}  # path of a nested list/tuple -> format first seen there

    # -- parsing -----------------------------------------------------------------------

    def transform(self, batch: Any) -> DefaultSiftingBatch:
        leaves: list[Leaf] = []
        if isinstance(batch, Mapping):
            n = self._mapping_size(batch)
            structure = self._parse_inner(batch, n, leaves, "")
            return DefaultSiftingBatch(structure, leaves, n)
        if isinstance(batch, torch.Tensor) or is_array(batch):
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
        if isinstance(batch, torch.Tensor) or is_array(batch):
            if fmt == FEATURE_MAJOR and batch.ndim < 2:
                raise UnsupportedDataFormatException(
                    f"batch_format_index=1 needs a tensor with at least 2 dimensions, got shape {tuple(batch.shape)}"
                )
            leaf = Leaf(batch, axis=fmt)
            leaves.append(leaf)
            return DefaultSiftingBatch(BatchStructure.leaf(0), leaves, leaf.size())
        if fmt == SAMPLE_MAJOR:
            leaves.append(Leaf(batch))
            return DefaultSiftingBatch(BatchStructure.leaf(0), leaves, len(batch))
        fields_of_tensors = _tensor_fields(batch)  # what default_collate makes of tuple datasets
        if fields_of_tensors is not None:
            return fields_of_tensors
        n_samples = _dim1_size(batch)
        if n_samples is None:
            raise UnsupportedDataFormatException(
                f"Unable to index the batch of type {type(batch)} by feature: its elements do not share one "
                "sample count (sizes "
                f"{[_leading_size(e) for e in batch]})"
            )
        children = [self._parse_inner(e, n_samples, leaves, f"[{i}]") for i, e in enumerate(batch)]
        return DefaultSiftingBatch(BatchStructure.sequence(type(batch), children), leaves, n_samples)

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
        fmt: int | None = None
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
            assert size is not None  # FEATURE_MAJOR is chosen just above only when d1 is not None
            if b is not None and size >= b:
                raise UnsupportedDataFormatException(
                    f"Batch size {b} does not match dimension 0 or dimension 1 sizes "
                    f"(dimension 0: {d0}, dimension 1: {d1}); pass batch_transforms"
                )
        self._top_format = fmt
        return fmt

    def _parse_inner(self, value: Any, n: int, leaves: list[Leaf], path: str) -> BatchStructure:
        if isinstance(value, Mapping):
            keys = list(value.keys())
            children = [self._parse_inner(value[k], n, leaves, f"{path}[{k!r}]") for k in keys]
            return BatchStructure.mapping(type(value), keys, children)
        if isinstance(value, torch.Tensor) or is_array(value):
            if value.ndim == 0 or value.shape[0] != n:
                shape = tuple(value.shape)
                raise UnsupportedDataFormatException(
                    f"Batch size {n} does not match dimension 0 of field {path or '<batch>'} with shape {shape}"
                )
            leaves.append(Leaf(value))
            return BatchStructure.leaf(len(leaves) - 1)
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
                leaves.append(Leaf(value))
                return BatchStructure.leaf(len(leaves) - 1)
            if as_fields:
                self._inner_formats[path] = FEATURE_MAJOR
                children = [self._parse_inner(e, n, leaves, f"{path}[{i}]") for i, e in enumerate(value)]
                return BatchStructure.sequence(type(value), children)
            raise UnsupportedDataFormatException(
                f"Batch size {n} does not match dimension 0 or dimension 1 sizes of field {path} "
                f"(dimension 0: {len(value)}, dimension 1: {d1})"
            )
        raise UnsupportedDataFormatException(
            f"Unable to index the batch of type {type(value)} at field {path or '<batch>'}: "
            "it has no sample dimension; pass batch_transforms"
        )

    # -- back to the user's format --------------------------------------------------------

    def reverse_transform(self, sifting_batch: SiftingBatch) -> Any:
        assert isinstance(sifting_batch, DefaultSiftingBatch)  # what transform() made
        return sifting_batch.to_user()
