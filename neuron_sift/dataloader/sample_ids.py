"""Each source batch's sample ids, for the per-batch loader's reference losses.

Why the sampler: the per-batch loader scores the batches its source yields, which carry
no ids; a reference table is keyed by dataset index. So the user's DataLoader is rebuilt
around a batch sampler that records every batch of indices as it hands them out
(``RecordingBatchSampler``, around the user's own batch sampler: its shuffling, its
``DistributedSampler`` and ``set_epoch`` unchanged; ``shared/rebuilt_loader.py`` keeps every
other setting and the wrappers), and each batch takes the oldest recorded one. DataLoader
hands batches out in the order its sampler made them (``in_order=True``, its default),
workers or not, so the two stay paired; the sampler runs ahead only by the prefetch.

A source with no sampler to wrap (an ``IterableDataset``, a loader class of the user's
own) gives ``sample_ids``: a function of a batch returning its ids (a stream whose
samples carry their index).
"""

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from neuron_sift.shared.rebuilt_loader import dataloader_settings, with_wrappers
from neuron_sift.shared.sources import unwrap

_ADVICE = (
    "give SiftingDataloader(sample_ids=fn), fn(batch) returning the batch's dataset indices, or use a "
    "torch.utils.data.DataLoader over a map-style dataset (its sampler's indices are the ids)"
)


class RecordingBatchSampler(Sampler[list[int]]):
    """The user's batch sampler, each batch of indices appended to ``recorded`` as handed out.

    Each pass records into a queue of its own (``recorded`` is the newest pass's): a pass
    abandoned with a prefetching thread still pulling (torch-xla's ``MpDeviceLoader``) keeps
    appending to its old queue, never to the one the next pass reads."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.recorded: deque[list[int]] = deque()
        # Read by the DataLoader and by anyone planning from it, as on the user's own.
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.sampler = getattr(inner, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        recorded: deque[list[int]] = deque()  # a new pass: what an abandoned one prefetched is not coming
        self.recorded = recorded
        for batch in self.inner:
            ids = [int(i) for i in batch]
            recorded.append(ids)
            yield ids

    def __len__(self) -> int:
        return len(self.inner)


class SampleIds:
    """Where the per-batch loader reads its source from, and each batch's ids: from the
    recording sampler (``source`` is then the rebuilt loader) or from ``ids_of``."""

    def __init__(self, orig: Any, ids_of: Callable[[Any], Any] | None) -> None:
        self.dataset: Any = None  # the map-style dataset the ids index, when known
        self._sampler: RecordingBatchSampler | None = None
        self._current: list[int] | None = None
        self._ids_of = ids_of
        if ids_of is not None:
            if not callable(ids_of):
                raise TypeError(f"sample_ids must be a function of a batch, got {type(ids_of).__name__}")
            self.source = orig
            chain = unwrap(orig)
            if chain.reaches_dataloader and not isinstance(chain.inner.dataset, IterableDataset):
                self.dataset = chain.inner.dataset
            return
        chain = unwrap(orig)
        if not chain.reaches_dataloader:
            raise TypeError(
                f"the reference table needs each batch's sample ids, and {chain.describe()} has no sampler; " + _ADVICE
            )
        loader = chain.inner
        if isinstance(loader.dataset, IterableDataset) or loader.batch_sampler is None:
            what = "an IterableDataset" if isinstance(loader.dataset, IterableDataset) else "batch_size=None"
            raise TypeError(
                f"the reference table needs each batch's sample ids, and the source DataLoader has {what}, "
                "no batch sampler to read them from; " + _ADVICE
            )
        if getattr(loader, "in_order", True) is False:
            raise ValueError(
                "the reference table pairs each batch with the indices its sampler made, in order; a DataLoader with "
                "in_order=False may deliver batches out of order: use in_order=True (the default)"
            )
        self.dataset = loader.dataset
        self._sampler = RecordingBatchSampler(loader.batch_sampler)
        self.source = with_wrappers(
            DataLoader(loader.dataset, batch_sampler=self._sampler, **dataloader_settings(loader)), chain.wrappers
        )

    def advance(self) -> None:
        """The source handed out its next batch (scored or not): take its recorded indices."""
        if self._sampler is not None:
            recorded = self._sampler.recorded  # the newest pass's
            if not recorded:
                raise RuntimeError("internal error: a source batch arrived before its sampler's indices")
            self._current = recorded.popleft()

    def of(self, batch: Any, n: int) -> torch.Tensor:
        """The ``n`` sample ids of ``batch``, the source's current one, as a CPU int64 tensor."""
        if self._ids_of is not None:
            raw = self._ids_of(batch)
            ids = torch.as_tensor(raw.detach().cpu() if isinstance(raw, torch.Tensor) else np.asarray(raw))
            if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() != 1:
                raise TypeError(
                    f"sample_ids(batch) must return a 1-D sequence of integer ids, got {ids.dtype} "
                    f"of shape {list(ids.shape)}"
                )
        else:
            assert self._current is not None  # advance() ran for this batch
            ids = torch.tensor(self._current, dtype=torch.int64)
        if ids.shape[0] != n:
            raise ValueError(
                f"a source batch of {n} samples came with {ids.shape[0]} sample ids: the collate function must keep "
                "one sample per index (or sample_ids(batch) return one id per sample)"
            )
        return ids.to(torch.int64)
