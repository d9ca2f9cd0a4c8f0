"""The user's sampler, read as the set of samples a plan may draw from and their order.

Why: the epoch loader replaces the DataLoader's sampling with its own plan, so whatever the
user's sampler meant must survive the replacement or be refused. A sampler that restricts
training to part of the dataset (a train/validation split by ``SubsetRandomSampler``, a
custom sampler over a subset) defines the *support*: the only samples any plan may load.
A sequential sampler (``shuffle=False``) asks for dataset order; the loader keeps it by
training each epoch's kept samples in dataset order. Samplers whose meaning a plan cannot
keep (sampling with replacement, by weight, a different count per epoch) are refused with
what to use instead, never widened to the whole dataset silently.

Known torch samplers are read from their settings. Any other sampler or batch sampler is
enumerated once, with the global random states (torch, NumPy, ``random``) and the sampler's
own generator restored afterwards, so reading it does not change the run: its set of
indices is honoured, its order is not (plans draw their own order).
"""

import itertools
import random
import zlib
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass
from numbers import Integral
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from neuron_sift.shared.sources import batch_settings

_SUBSET_HINT = (
    "to train on part of the dataset, wrap it in torch.utils.data.Subset (or use a SubsetRandomSampler "
    "over unique indices) and weight samples in the loss if needed"
)


@dataclass(frozen=True)
class Sampling:
    """What a plan may draw: ``support`` (sorted unique dataset indices, int64; None: all
    ``n`` samples) and whether kept samples train in dataset order (``ordered``)."""

    support: np.ndarray | None
    ordered: bool

    def size(self, n: int) -> int:
        return n if self.support is None else int(self.support.shape[0])


def support_checksum(support: np.ndarray | None) -> int | None:
    """The CRC-32 of a support's sorted int64 ids (None: every sample): the one checksum of
    the samples a plan may draw, checked across ranks (``planning/rank_settings.py``) and named in
    every checkpoint."""
    return None if support is None else zlib.crc32(support.astype("<i8").tobytes())


def read_sampling(loader: "DataLoader[Any]", n: int, world_size: int) -> Sampling:
    """The support and order of ``loader``'s sampling over a dataset of ``n`` samples, or a
    ``TypeError``/``ValueError`` saying what to use instead. ``world_size``: the ranks the
    epoch loader shards its plans over (a user's ``DistributedSampler`` must agree)."""
    settings = batch_settings(loader)
    if settings.batch_sampler is not None:  # built with batch_sampler=: DataLoader's .sampler is a default
        return _read_batch_sampler(settings.batch_sampler, n, world_size)
    return _read_sampler(settings.sampler, n, world_size)


def _read_batch_sampler(batch_sampler: Any, n: int, world_size: int) -> Sampling:
    if type(batch_sampler).__iter__ is BatchSampler.__iter__ and hasattr(batch_sampler, "sampler"):
        return _read_sampler(batch_sampler.sampler, n, world_size)  # the plain BatchSampler batches its sampler
    inner = getattr(batch_sampler, "batch_sampler", None)
    shards = getattr(batch_sampler, "num_processes", None)
    if inner is not None and isinstance(shards, int):  # accelerate's BatchSamplerShard: one rank's batches
        if shards != world_size:
            raise ValueError(
                f"the batch sampler {type(batch_sampler).__name__} shards batches over {shards} processes but "
                f"EpochSiftingDataloader runs on {world_size} rank(s); it shards each epoch's plan over the ranks "
                "itself: build the source loader without sharding or with the same number of processes"
            )
        return _read_batch_sampler(inner, n, world_size)
    return _enumerated(batch_sampler, n, batches=True)


def _read_sampler(sampler: Any, n: int, world_size: int) -> Sampling:
    name = type(sampler).__name__
    if isinstance(sampler, DistributedSampler):
        if sampler.num_replicas != world_size:
            raise ValueError(
                f"the DistributedSampler has num_replicas={sampler.num_replicas} but EpochSiftingDataloader runs "
                f"on {world_size} rank(s); the epoch loader shards each plan over the ranks itself: pass a "
                "DistributedSampler with the same world size, or shuffle=True without one"
            )
        return Sampling(_all_of(len(cast(Sized, sampler.dataset)), n, name), not sampler.shuffle)
    if isinstance(sampler, WeightedRandomSampler):
        raise TypeError(
            "EpochSiftingDataloader does not honour a WeightedRandomSampler: it draws with replacement by "
            "weight, a distribution the epoch plans (each sample at most once, weighted by 1/keep "
            "probability) do not reproduce; use shuffle=True and multiply each sample's loss by its weight "
            f"before weighted_loss, or {_SUBSET_HINT}"
        )
    if isinstance(sampler, RandomSampler):  # also subclasses, such as accelerate's SeedableRandomSampler
        if sampler.replacement or sampler.num_samples != len(sampler.data_source):
            raise ValueError(
                f"EpochSiftingDataloader does not honour a {name} with replacement={sampler.replacement} and "
                f"num_samples={sampler.num_samples} (of {len(sampler.data_source)} samples): a plan trains each "
                f"sample at most once per epoch; use shuffle=True with the default sampler, or {_SUBSET_HINT}"
            )
        return Sampling(_all_of(len(sampler.data_source), n, name), False)
    if isinstance(sampler, SequentialSampler):  # shuffle=False: dataset order
        return Sampling(_all_of(len(sampler.data_source), n, name), True)
    if isinstance(sampler, SubsetRandomSampler):
        return Sampling(_unless_all(_support(sampler.indices, n, name), n), False)
    return _enumerated(sampler, n, batches=False)


def _all_of(length: int, n: int, name: str) -> np.ndarray | None:
    """The first ``length`` indices: all of them (None) when the sampler covers the dataset."""
    return _unless_all(_support(range(length), n, name), n)


def _unless_all(support: np.ndarray, n: int) -> np.ndarray | None:
    """None for a support of every sample: plans over all samples stay those of the default sampler."""
    return None if support.shape[0] == n else support


def _support(indices: Iterable[Any], n: int, name: str) -> np.ndarray:
    """``indices`` as a sorted int64 array, refusing a non-index, one out of range, a repeat
    or none at all. Read in chunks, so a sampler that never ends stops at its first repeat."""
    seen = np.zeros(n, dtype=bool)
    count = 0
    for chunk in _chunks(indices, name):
        bad = chunk[(chunk < 0) | (chunk >= n)]
        if bad.size:
            raise ValueError(f"the sampler {name} yields index {int(bad[0])}, outside the dataset's {n} samples")
        ordered = np.sort(chunk)
        repeats = np.concatenate([ordered[1:][ordered[1:] == ordered[:-1]], chunk[seen[chunk]]])
        if repeats.size:
            raise ValueError(
                f"the sampler {name} yields index {int(repeats[0])} more than once per epoch (sampling with "
                "replacement or repeated indices); EpochSiftingDataloader trains each sample at most once per "
                f"epoch: {_SUBSET_HINT}"
            )
        seen[chunk] = True
        count += chunk.shape[0]
    if count == 0:
        raise ValueError(f"the sampler {name} yields no samples")
    return np.flatnonzero(seen).astype(np.int64)


def _chunks(indices: Iterable[Any], name: str, size: int = 1 << 16) -> Iterator[np.ndarray]:
    """``indices`` as int64 arrays: at once for arrays, tensors and ranges, else ``size`` at a time."""
    if isinstance(indices, range):
        yield np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
        return
    if isinstance(indices, torch.Tensor | np.ndarray):
        indices = indices.tolist()
    it = iter(indices)
    while chunk := list(itertools.islice(it, size)):
        yield np.fromiter((_as_index(raw, name) for raw in chunk), dtype=np.int64, count=len(chunk))


def _as_index(raw: Any, name: str) -> int:
    if isinstance(raw, torch.Tensor) and raw.dim() == 0 and not raw.is_floating_point() and not raw.is_complex():
        raw = raw.item()
    if isinstance(raw, bool | np.bool_) or not isinstance(raw, Integral | np.integer):
        raise TypeError(
            f"the sampler {name} yields {raw!r} ({type(raw).__name__}), not a sample index; "
            "EpochSiftingDataloader needs a sampler of int indices into a map-style dataset"
        )
    return int(raw)


def _flatten(batches: Iterable[Any], name: str) -> Iterable[Any]:
    for batch in batches:
        if isinstance(batch, str | bytes) or not isinstance(batch, Iterable):
            raise TypeError(f"the batch sampler {name} yields {batch!r}, not a batch (a list) of sample indices")
        yield from batch


def _enumerated(sampler: Any, n: int, batches: bool) -> Sampling:
    """A sampler of unknown kind, read by iterating it once with every random state it could
    touch restored afterwards. Stops at the first repeat, so an endless sampler ends too."""
    name = type(sampler).__name__
    generator = getattr(sampler, "generator", None)
    own = generator.get_state() if isinstance(generator, torch.Generator) else None
    saved = (torch.random.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        try:
            it = iter(sampler)
        except TypeError as exc:
            raise TypeError(f"the sampler {name} is not iterable: {exc}") from exc
        support = _support(_flatten(it, name) if batches else it, n, name)
    finally:
        torch.random.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])
        if own is not None and isinstance(generator, torch.Generator):
            generator.set_state(own)
    return Sampling(_unless_all(support, n), False)
