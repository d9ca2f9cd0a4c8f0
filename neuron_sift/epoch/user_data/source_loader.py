"""The user's DataLoader, inspected and rebuilt around the planned batch sampler.

Only the sampling changes: ``EpochSiftingDataloader`` builds a new ``DataLoader`` over the
same map-style dataset with the user's settings (batch size, workers, collate function,
pin memory, prefetch factor, persistent workers, timeout, worker init, multiprocessing
context, generator, ``drop_last``) and its own ``batch_sampler``; the wrappers the user's
DataLoader came in (found by ``neuron_sift.shared.sources.unwrap``: torch-xla's
``MpDeviceLoader``, accelerate's ``MpDeviceLoaderWrapper`` and ``DataLoaderShard``) are
copied, outermost first, with the new DataLoader inside, so whatever they do per batch
(device transfer, accelerate's RNG synchronisation and gradient state) still happens.
Nothing is patched globally.

Large-dataset formats: the saving is that a skipped sample is never read, so the dataset
must be read by index. A Hugging Face ``datasets.Dataset`` (Arrow) is map-style already.
An ``IterableDataset`` that also reads by index (MosaicML Streaming's ``StreamingDataset``
over MDS shards) is read through ``IndexedView``, a map-style view of it; the user's
object is left as it was. Its own iteration's settings that the plans would ignore
(shuffling, resampling, partitioning over ranks) are refused (``user_data/streaming_settings.py``).
A pure stream is refused: it can only be read in its own order, so skipping a sample would
still read it.

Sources that would train nothing are refused here too: with ``drop_last`` a dataset (or a
rank's share of an epoch, or a budget's share: ``check_planned_counts``) shorter than one
batch yields no batch, and the loop would run zero steps without a word.
"""

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, Sampler, SequentialSampler

from neuron_sift.epoch.user_data.streaming_settings import check_streaming_settings
from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.shared.rebuilt_loader import dataloader_settings, with_wrappers
from neuron_sift.shared.sources import WRAPPER_ATTRIBUTES, batch_settings, unwrap

logger = logging.getLogger(EPOCH_LOGGER)


SUPPORTED = (
    "a torch.utils.data.DataLoader over a map-style dataset with __len__ (one whose __getitem__ takes a "
    "sample index; a Hugging Face datasets.Dataset, or an IterableDataset that also reads by index, such as "
    "MosaicML Streaming's StreamingDataset), with a batch size; or wrappers around one, each holding the next as "
    + " or ".join(f".{a}" for a in WRAPPER_ATTRIBUTES)
    + " (torch-xla's MpDeviceLoader, accelerate's prepared loaders)"
)

_STREAM_ALTERNATIVES = (
    "use a map-style dataset (__getitem__ by sample index and __len__): a torch Dataset, a Hugging Face "
    "datasets.Dataset (Arrow: load_from_disk, or load_dataset without streaming=True), MosaicML Streaming's "
    "StreamingDataset over MDS shards (read by index), or give the stream __getitem__(index) and __len__; "
    "or sift the stream per batch with SiftingDataloader"
)


class IndexedView(Dataset[Any]):
    """An ``IterableDataset`` that also reads by index, seen as the map-style dataset the
    planned batch sampler needs.

    Why a view: a DataLoader refuses a batch sampler over an ``IterableDataset``, and iterating
    the dataset would read every sample in its own order. Reads go to the dataset's own
    ``__getitem__`` (or ``__getitems__``, one call per batch, when it has one), so its
    shard cache and decoding stay its own; its iteration, shuffling and partitioning over
    ranks are not used (the plans do that).
    """

    def __init__(self, source: Any, n: int) -> None:
        self.source = source
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.source[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        many = getattr(self.source, "__getitems__", None)
        return list(many(indices)) if many is not None else [self.source[i] for i in indices]


@dataclass
class SourceInfo:
    dataloader: "DataLoader[Any]"  # the user's, or a stand-in over an IndexedView (its settings, a plain sampler)
    wrappers: tuple[tuple[Any, str], ...]  # the user's wrappers, outermost first, with the attribute to the next
    n: int
    batch_size: int
    drop_last: bool
    generator_seed: int | None


def inspect_source(orig: Any) -> SourceInfo:
    """What the epoch loader needs from the user's loader, or a TypeError naming what is supported."""
    chain = unwrap(orig)
    if not chain.reaches_dataloader:
        raise TypeError(f"EpochSiftingDataloader needs {SUPPORTED}; got {chain.describe()}, with no DataLoader inside")
    loader = chain.inner
    settings = batch_settings(loader)
    b = settings.batch_size
    if b is None or b < 1:
        raise TypeError(f"EpochSiftingDataloader needs {SUPPORTED}; this DataLoader has no batch size")
    ds = loader.dataset
    if isinstance(ds, IterableDataset):
        loader = _over_view(loader, _view(ds), b, settings.drop_last)
        ds = loader.dataset
    try:
        n = len(ds)
    except TypeError as exc:
        raise TypeError(
            f"EpochSiftingDataloader needs {SUPPORTED}; the dataset {type(ds).__name__} has no length"
        ) from exc
    if n < 1:
        raise ValueError("EpochSiftingDataloader: the dataset is empty")
    if getattr(loader, "in_order", True) is False:
        raise ValueError(
            "EpochSiftingDataloader pairs losses with batches in the order the sampler produced them; "
            "a DataLoader with in_order=False may deliver batches out of order: use in_order=True (the default)"
        )
    gen = loader.generator
    return SourceInfo(
        loader, chain.wrappers, n, b, settings.drop_last, int(gen.initial_seed()) if gen is not None else None
    )


def _view(ds: IterableDataset[Any]) -> IndexedView:
    """``ds`` read by index, or a TypeError saying why a stream cannot be sifted at the sampler."""
    name = type(ds).__name__
    indexed = type(ds).__getitem__ is not Dataset.__getitem__  # torch's Dataset.__getitem__ only raises
    n = _index_space(ds) if indexed else None
    if n is None:
        raise TypeError(
            "EpochSiftingDataloader plans each epoch at the sampler and skips samples before they are loaded; the "
            f"DataLoader's dataset is an IterableDataset ({name}) without random access (__getitem__ by sample "
            "index and __len__): a stream is read in its own order, so a skipped sample would still be read. "
            + _STREAM_ALTERNATIVES
        )
    check_streaming_settings(ds)  # MosaicML Streaming's iteration settings the plans would ignore
    epoch_size = getattr(ds, "epoch_size", None)
    if _is_count(epoch_size) and epoch_size != n:
        raise ValueError(
            f"the IterableDataset {name} resamples an epoch of {epoch_size} samples from its {n} (epoch_size, "
            "stream proportions or repeats); EpochSiftingDataloader plans epochs over the samples themselves, each "
            "trained at most once per epoch: build it without resampling (leave epoch_size unset, every sample "
            "once per epoch)"
        )
    return IndexedView(ds, n)


def _index_space(ds: Any) -> int | None:
    """How many sample indices ``ds[i]`` accepts. An integer ``size`` comes first: MosaicML
    Streaming's ``__len__`` is one rank's share of a (possibly resampled) epoch, while its
    ``size`` counts every sample its random access reads."""
    size = getattr(ds, "size", None)
    if _is_count(size):
        return int(size)  # a NumPy integer from a metadata file, as a Python int
    try:
        return len(ds)
    except TypeError:
        return None


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _over_view(src: "DataLoader[Any]", view: IndexedView, batch_size: int, drop_last: bool) -> "DataLoader[Any]":
    """A stand-in for the user's DataLoader over ``view``: the same settings, and the sampler
    a plan reads (``user_data/sampling.py``). The order follows the dataset's ``shuffle`` flag
    (MosaicML Streaming's): ``shuffle=False`` trains in dataset order; otherwise plans
    draw their own order."""
    sampler: Sampler[int]
    if getattr(view.source, "shuffle", None) is False:
        sampler = SequentialSampler(view)
    else:
        sampler = RandomSampler(view, generator=src.generator)
    return DataLoader(view, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **dataloader_settings(src))


class PlannedBatchSampler(Sampler[list[int]]):
    """Yields the planned batches of the current epoch from ``start`` (set by the loader)."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.start = 0

    def __iter__(self) -> Iterator[list[int]]:
        for ids in self.batches[self.start :]:
            yield ids.tolist()

    def __len__(self) -> int:
        return max(0, len(self.batches) - self.start)


def rebuild(orig: Any, info: SourceInfo, batch_sampler: PlannedBatchSampler) -> Any:
    """The user's loader (and its wrappers) with ``batch_sampler`` in place of its sampling."""
    src = info.dataloader
    return with_wrappers(
        DataLoader(src.dataset, batch_sampler=batch_sampler, **dataloader_settings(src)), info.wrappers
    )
