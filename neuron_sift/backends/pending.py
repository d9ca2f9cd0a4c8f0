"""Kept samples pending until a full batch: one interface, a host and a device implementation.

Why the backend makes it: where the pending samples live, what has to be read back to
know which rows were kept, and when the device's lazy graph is cut are device questions.
On the host (CPU, CUDA, and any batch type other than the default one) the kept row
indices are read back once per source batch and the kept rows are joined with the
batch's own ``select``/``concat``; on an XLA device the default batch's tensor fields are
gathered into fixed-size device buffers, so nothing of varying shape is traced
(``device_pending.py``). The loader sees only this interface.
"""

import abc
from dataclasses import dataclass
from typing import Any

from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.default_batch import DefaultSiftingBatch
from neuron_sift.data_model.saved_batch import SavedBatch


@dataclass
class Kept:
    """What is known on the host about one source batch's selection.

    ``count``: rows kept; ``nonfinite``: non-finite losses among them (0 where nothing was
    read); ``indices``: the kept rows in source order (a CPU int64 tensor or a list), when
    they were read back.
    """

    count: int
    nonfinite: int
    indices: Any | None


class PendingStore(abc.ABC):
    """Turns the kept rows of scored source batches into batches of exactly ``batch_size``.

    Samples restored from a checkpoint (``restore``) stay pending without their container
    types until a source batch gives them their types again (``bind``); they come out first.
    """

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._restored: SavedBatch | None = None

    # -- the per-source-batch path -------------------------------------------------------------

    def prepare(self, batch: SiftingBatch, source: Any) -> tuple[SiftingBatch, Any]:
        """The batch to score and what the loss gets as ``original_batch``: unchanged here."""
        return batch, source

    @abc.abstractmethod
    def read_kept(self, sifter: Any, scored: SiftingBatch, out: Any, n: int) -> Kept:
        """The host's view of the selection ``out`` of ``scored`` (``n`` real rows): the host reads it needs."""

    @abc.abstractmethod
    def add(self, scored: SiftingBatch, out: Any, kept: Kept, n_admitted: int) -> None:
        """Make the first ``n_admitted`` kept rows of ``scored`` pending (the rest are dropped)."""

    @abc.abstractmethod
    def pop(self) -> SiftingBatch | None:
        """The next full batch, or None while fewer than ``batch_size`` samples are pending."""

    @abc.abstractmethod
    def num_bound(self) -> int:
        """Pending samples, restored ones not yet bound excluded."""

    @abc.abstractmethod
    def pending_batch(self) -> SiftingBatch | None:
        """The pending samples as one batch, for inspection (None if none)."""

    @abc.abstractmethod
    def pending_on_host(self) -> SiftingBatch | None:
        """The pending samples with every tensor on the CPU, for checkpoints (None if none)."""

    @abc.abstractmethod
    def _insert_restored(self, batch: SiftingBatch) -> None:
        """Put bound restored samples ahead of anything kept from now on."""

    # -- restored samples ----------------------------------------------------------------------

    def __len__(self) -> int:
        return self.num_bound() + (self._restored.size if self._restored is not None else 0)

    def restore(self, saved: SavedBatch) -> None:
        if self._restored is not None or self.num_bound():
            raise RuntimeError("internal error: restoring into a store that holds samples")
        self._restored = saved

    @property
    def has_unbound(self) -> bool:
        return self._restored is not None

    def bind(self, like: SiftingBatch) -> None:
        """Give restored samples the container types of ``like`` (a source batch) and queue them first."""
        if self._restored is None:
            return
        batch = self._restored.bind(like)
        self._restored = None
        self._insert_restored(batch)

    def saved(self) -> dict | None:
        """The pending samples as checkpoint data (plain values, CPU tensors), or None."""
        if self._restored is not None:
            return self._restored.state
        return SavedBatch.of(self.pending_on_host())


class HostPending(PendingStore):
    """Kept rows selected on the host and joined once per emitted batch.

    Pieces are concatenated once per emitted batch (not once per piece), so the cost of
    accumulation is linear in the samples kept. Whatever is left over stays pending: it
    is carried into the next epoch and emitted first there.
    """

    def __init__(self, batch_size: int):
        super().__init__(batch_size)
        self._pieces: list[SiftingBatch] = []
        self._size = 0

    def read_kept(self, sifter: Any, scored: SiftingBatch, out: Any, n: int) -> Kept:
        indices, nonfinite = sifter.read_selection(out)
        return Kept(int(indices.shape[0]), nonfinite, indices)

    def add(self, scored: SiftingBatch, out: Any, kept: Kept, n_admitted: int) -> None:
        indices = kept.indices
        assert indices is not None  # read_kept always reads them here
        # The default batch takes the index tensor; a user's SiftingBatch gets Python ints.
        picked = indices[:n_admitted] if isinstance(scored, DefaultSiftingBatch) else indices[:n_admitted].tolist()
        self._append(scored.select(picked))

    def _append(self, piece: SiftingBatch) -> None:
        n = len(piece)
        if n:
            self._pieces.append(piece)
            self._size += n

    def _insert_restored(self, batch: SiftingBatch) -> None:
        self._append(batch)

    def num_bound(self) -> int:
        return self._size

    def pop(self) -> SiftingBatch | None:
        b = self.batch_size
        if self._size < b:
            return None
        first, rest = self._pieces[0], self._pieces[1:]
        merged = first.concat(rest) if rest else first
        total = len(merged)
        if total == b:
            self._pieces, self._size = [], 0
            return merged
        out, remainder = merged.split_at(b)
        self._pieces, self._size = [remainder], total - b
        return out

    def pending_batch(self) -> SiftingBatch | None:
        if not self._pieces:
            return None
        return self._pieces[0].concat(self._pieces[1:]) if len(self._pieces) > 1 else self._pieces[0]

    def pending_on_host(self) -> SiftingBatch | None:
        return self.pending_batch()  # SavedBatch moves every tensor to the CPU
