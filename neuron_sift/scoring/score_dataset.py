"""``score_dataset``: a reference model's loss for every sample of a dataset, written once to disk.

Why a utility of its own: the reference scores (RHO-LOSS's irreducible loss) are a pass
over the whole training set with a model that does not change, so they are computed once,
before training, and may take hours on a large dataset. The pass is the loaders' scoring
forward (the user's ``Loss`` in eval mode, without gradients), saved every ``save_every``
batches so a preempted job continues where it stopped, split by ``id % W`` over the ranks
of a torchrun job, each rank writing only its own shard. On a device that compiles a graph
per shape the short last batch is padded with its last sample, so the model sees one shape.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from neuron_sift.backends import Backend, resolve_backend
from neuron_sift.backends.base import model_device
from neuron_sift.loss.abstract_sift_loss_module import resolve_loss_fn
from neuron_sift.scoring import reference_files as files
from neuron_sift.scoring.forward import check_losses, scoring_mode
from neuron_sift.scoring.progress import ScoringProgress
from neuron_sift.scoring.reference_folder import ShardWriter, barrier, open_folder
from neuron_sift.scoring.reference_table import ReferenceTable, as_ids, dataset_fingerprint, dataset_size
from neuron_sift.shared.ranks import RankGroup


def _count(name: str, value: Any, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"score_dataset: {name} must be an int >= {least}, got {value!r}")
    return value


def _selected(ids: Any, n: int) -> np.ndarray | None:
    """The sorted unique ids to score (None: all of ``0 .. n-1``)."""
    if ids is None:
        return None
    chosen = np.unique(as_ids(ids))
    if chosen.shape[0] == 0:
        raise ValueError(
            "score_dataset: ids is empty, so there is nothing to score; pass ids=None to score every sample"
        )
    outside = chosen[(chosen < 0) | (chosen >= n)]
    if outside.shape[0]:
        raise ValueError(
            f"score_dataset: id {int(outside[0])} is outside [0, {n}) of the dataset; pass indices of dataset[i]"
        )
    return chosen


def score_dataset(
    model: torch.nn.Module,
    dataset: Any,
    loss_impl: Any,
    path: str | Path,
    *,
    batch_size: int,
    ids: Any = None,
    collate_fn: Any = None,
    batch_transforms: Any = None,
    num_workers: int = 0,
    device: torch.device | str | None = None,
    backend: str | Backend | None = None,
    distributed: bool | None = None,
    progress: bool = True,
    save_every: int = 32,
    description: str = "",
) -> ReferenceTable:
    """Score every sample of ``dataset`` (or only ``ids``) with ``model`` and write the table to folder ``path``.

    The loss is the loaders' interface: ``loss_impl.loss(model, transformed, batch)`` with
    ``transformed = batch_transforms.transform(batch)`` (``batch`` itself without
    ``batch_transforms``), run in eval mode without gradients, one finite loss per sample.
    Batches of ``batch_size`` come from a ``DataLoader`` over the ids in order (your
    ``collate_fn``, ``num_workers``); move them to the model's device in your loss, as for
    the loaders. Losses stay on the device and are read and saved every ``save_every``
    batches; called again with the same path and settings, it continues where the last call
    stopped. Under torchrun (``distributed`` not False) rank ``r`` of ``W`` scores the ids
    ``id % W == r`` into its own shard; every rank returns the whole table.

    Args:
        model: the reference model (a model trained on held-out data).
        dataset: a map-style dataset; sample id ``i`` is ``dataset[i]``.
        loss_impl: an object with ``loss(model, transformed_batch, original_batch)`` (a ``Loss``).
        path: the table's folder (created; a folder of an unfinished call with the same settings is continued).
        batch_size: samples per scoring batch.
        ids: the sample ids to score (others stay uncovered); None: all.
        collate_fn: as for ``torch.utils.data.DataLoader`` (None: its default collation).
        batch_transforms: a ``SiftingBatchTransform`` whose ``transform`` feeds the loss (None: the batch).
        num_workers: as for ``torch.utils.data.DataLoader`` (0: load in this process).
        device: the model's device (None: where its parameters are).
        backend: ``"eager"``, ``"compiled"``, ``"xla"``, a ``Backend`` or None (from the device).
        distributed: None: split over the ranks when torch.distributed has more than one;
            True: require that; False: score everything in this process.
        progress: a progress line on stderr (rank 0).
        save_every: batches between saves (each one host read of the losses).
        description: free text kept in the table (which reference model, trained on what).

    Raises:
        ValueError: a bad argument, a folder written with other settings, a non-finite loss
            (naming its sample id).
        RuntimeError: ``distributed=True`` without more than one rank.
    """
    loss_fn = resolve_loss_fn(loss_impl)
    n = dataset_size(dataset, "score_dataset")
    if n == 0:
        raise ValueError("score_dataset: the dataset is empty; there is nothing to score")
    batch_size = _count("batch_size", batch_size, 1)
    save_every = _count("save_every", save_every, 1)
    if not isinstance(description, str):
        raise TypeError(f"score_dataset: description must be a str, got {type(description).__name__}")
    if batch_transforms is not None and not callable(getattr(batch_transforms, "transform", None)):
        raise TypeError(
            f"score_dataset: batch_transforms of type {type(batch_transforms).__name__} has no transform(batch) method"
        )
    if distributed not in (None, True, False):
        raise TypeError(f"score_dataset: distributed must be None, True or False, got {distributed!r}")
    chosen = _selected(ids, n)
    be = resolve_backend(torch.device(device) if device is not None else model_device(model), backend)
    ranks = RankGroup(distributed, be.device)
    folder = Path(path)
    digest = files.ids_sha256(chosen, n)
    covered = n if chosen is None else int(chosen.shape[0])
    want = files.manifest(n, ranks.world_size, dataset_fingerprint(dataset), description, digest, covered)
    open_folder(folder, want, ranks)
    if chosen is None:
        todo = np.arange(ranks.rank, n, ranks.world_size, dtype=np.int64)
    else:
        todo = chosen[chosen % ranks.world_size == ranks.rank]
    shard = ShardWriter(folder, want, ranks.rank, todo)
    label = "score_dataset" if ranks.world_size == 1 else f"score_dataset (rank 0 of {ranks.world_size})"
    report = ScoringProgress(todo.shape[0], shard.done, progress and ranks.rank == 0, label)
    try:
        _score(
            model,
            dataset,
            loss_fn,
            be,
            shard,
            report,
            batch_size,
            save_every,
            collate_fn,
            batch_transforms,
            num_workers,
        )
    finally:
        report.close()
    barrier(ranks)
    if ranks.rank == 0:
        files.write_manifest(folder, want)  # this call's description
    barrier(ranks)
    return ReferenceTable.load(folder)


class _Order(Sequence[int]):
    """The ids to score as Python ints (what ``dataset[i]`` expects), without a list of them;
    positions past the ids repeat the last one (the padding of a fixed-shape last batch)."""

    def __init__(self, ids: np.ndarray, length: int):
        self.ids, self.length = ids, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.length))]
        if not 0 <= i < self.length:
            raise IndexError(i)
        return int(self.ids[min(i, self.ids.shape[0] - 1)])


def _score(
    model: torch.nn.Module,
    dataset: Any,
    loss_fn: Any,
    be: Backend,
    shard: ShardWriter,
    report: ScoringProgress,
    batch_size: int,
    save_every: int,
    collate_fn: Any,
    batch_transforms: Any,
    num_workers: int,
) -> None:
    """Score the shard's ids from ``shard.done`` on, saving every ``save_every`` batches."""
    real = shard.todo.shape[0] - shard.done
    if real == 0:
        return
    padding = (-real) % batch_size if be.fixed_shapes else 0
    rest = _Order(shard.todo[shard.done :], real + padding)
    loader = DataLoader(
        Subset(dataset, rest), batch_size=batch_size, shuffle=False, collate_fn=collate_fn, num_workers=num_workers
    )
    start = shard.done
    pending: list[torch.Tensor] = []
    issued = 0  # rows scored in this call, padding included

    def flush() -> None:
        if pending:
            host = be.to_host(torch.cat(pending) if len(pending) > 1 else pending[0])
            pending.clear()
            shard.record(host[: start + real - shard.done])  # the padding rows come last: dropped

    with scoring_mode(model):
        for batch in loader:
            rows = min(batch_size, len(rest) - issued)
            transformed = batch_transforms.transform(batch) if batch_transforms is not None else batch
            pending.append(check_losses(loss_fn(model, transformed, batch), rows, be))
            be.sync()  # cut the device's graph per batch: one graph per shape, not one per save
            issued += rows
            report.update(start + min(issued, real))
            if len(pending) == save_every:
                flush()
        flush()
