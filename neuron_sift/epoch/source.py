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
"""

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, IterableDataset, Sampler

from neuron_sift.shared.sources import WRAPPER_ATTRIBUTES, batch_settings, unwrap

SUPPORTED = (
    "a torch.utils.data.DataLoader over a map-style dataset with __len__ (one whose __getitem__ takes a "
    "sample index), with a batch size; or wrappers around one, each holding the next as "
    + " or ".join(f".{a}" for a in WRAPPER_ATTRIBUTES)
    + " (torch-xla's MpDeviceLoader, accelerate's prepared loaders)"
)


@dataclass
class SourceInfo:
    dataloader: "DataLoader[Any]"
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
    ds = loader.dataset
    if isinstance(ds, IterableDataset):
        raise TypeError(
            f"EpochSiftingDataloader plans each epoch at the sampler, so it needs {SUPPORTED}; the DataLoader's "
            f"dataset is an IterableDataset ({type(ds).__name__}), which has no sample indices to plan"
        )
    try:
        n = len(ds)
    except TypeError as exc:
        raise TypeError(
            f"EpochSiftingDataloader needs {SUPPORTED}; the dataset {type(ds).__name__} has no length"
        ) from exc
    if n < 1:
        raise ValueError("EpochSiftingDataloader: the dataset is empty")
    settings = batch_settings(loader)
    b = settings.batch_size
    if b is None or b < 1:
        raise TypeError(f"EpochSiftingDataloader needs {SUPPORTED}; this DataLoader has no batch size")
    if getattr(loader, "in_order", True) is False:
        raise ValueError(
            "EpochSiftingDataloader pairs losses with batches in the order the sampler produced them; "
            "a DataLoader with in_order=False may deliver batches out of order: use in_order=True (the default)"
        )
    gen = loader.generator
    return SourceInfo(
        loader, chain.wrappers, n, b, settings.drop_last, int(gen.initial_seed()) if gen is not None else None
    )


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
    kwargs: dict[str, Any] = dict(
        num_workers=src.num_workers,
        collate_fn=src.collate_fn,
        pin_memory=src.pin_memory,
        timeout=src.timeout,
        worker_init_fn=src.worker_init_fn,
        multiprocessing_context=src.multiprocessing_context,
        generator=src.generator,
        persistent_workers=src.persistent_workers,
        pin_memory_device=src.pin_memory_device,
    )
    if src.num_workers > 0:
        kwargs["prefetch_factor"] = src.prefetch_factor
    if hasattr(src, "in_order"):
        kwargs["in_order"] = src.in_order
    node: Any = DataLoader(src.dataset, batch_sampler=batch_sampler, **kwargs)
    for wrapper, attribute in reversed(info.wrappers):  # shallow copies: the user's wrappers stay as they were
        outer = copy.copy(wrapper)
        setattr(outer, attribute, node)
        node = outer
    return node
