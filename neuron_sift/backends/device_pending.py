"""The pending store on an XLA device: kept rows gathered into buffers of static shape.

On an XLA device a ``tensor[host_indices]`` of varying length is a new graph per length.
Here every tensor field of the batch has a pending buffer of fixed capacity
``L + m`` rows (m: rows offered per source batch, P in probabilistic mode, k in fixed
mode; L: the most rows that may be pending, the batch size, or the loader's bound on
pending samples under data-parallel agreement). Each source batch writes its ``m`` candidate
rows, kept ones first, at the current fill offset (a device scalar, so no new graph);
rows past the kept count land in the unused tail and are overwritten later. When ``B``
rows are pending, ``buffer[:B]`` is emitted and the buffer is rotated by ``B``. All shapes are static, and the host only
needs the kept count: known in fixed mode, one scalar read in probabilistic mode.

Fields that are not tensors (lists of strings, NumPy arrays) stay on the host and need
the kept row indices, i.e. one host read per source batch.
"""

from typing import Any

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.backends.pending import Kept, PendingStore
from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.default_batch import DefaultSiftingBatch
from neuron_sift.data_model.leaves import Leaf
from neuron_sift.exceptions import UnsupportedDataFormatException


def is_device_leaf(leaf: Leaf) -> bool:
    return isinstance(leaf.value, torch.Tensor)


def batch_to_device(batch: DefaultSiftingBatch, device: torch.device) -> DefaultSiftingBatch:
    """Tensor fields moved to ``device`` (a no-op for tensors already there)."""
    leaves = [
        Leaf(leaf.value.to(device), leaf.axis) if isinstance(leaf.value, torch.Tensor) else leaf
        for leaf in batch.leaves
    ]
    return DefaultSiftingBatch(batch.structure, leaves, len(batch))


def pad_batch(batch: DefaultSiftingBatch, rows: int) -> DefaultSiftingBatch:
    """``batch`` padded to ``rows`` samples by repeating its last sample.

    A real sample, not zeros, so any model accepts it (valid token ids, non-empty
    attention masks); its loss is masked out and it is never kept.
    """
    n = len(batch)
    if n >= rows:
        return batch
    return batch.select(list(range(n)) + [n - 1] * (rows - n))


def has_host_leaves(batch: DefaultSiftingBatch) -> bool:
    return any(not is_device_leaf(leaf) for leaf in batch.leaves)


class PendingBuffers:
    """Fixed-capacity device buffers that turn kept rows into batches of exactly ``B``.

    ``rows_per_add``: the rows each ``add`` writes (m). ``limit``: None when emission
    drains the buffer below ``B`` before every ``add`` (one process, or fixed mode); else the
    loader's bound on pending samples, kept by dropping the newest kept rows past it. The
    buffers hold ``B + m`` or ``limit + m`` rows, and ``add`` checks on the host that its
    write fits before writing: an index past the buffer would not fail on an XLA device, it
    would overwrite pending samples and repeat others.
    """

    def __init__(self, batch_size: int, backend: Backend, rows_per_add: int, limit: int | None = None):
        self.batch_size = batch_size
        self.backend = backend
        self.rows_per_add = rows_per_add
        if limit is not None and limit < batch_size:
            raise ValueError(f"limit {limit} is below the batch size {batch_size}")
        self.limit = limit
        self._capacity = (batch_size if limit is None else limit) + rows_per_add
        self.fill = 0  # host mirror: decides emission without reading the device
        self._fill_t: torch.Tensor | None = None  # device copy: the write offset
        self._structure: Any = None
        self._buffers: list[Any] | None = None  # per leaf: device tensor, or a host Leaf of pending samples
        self._axes: list[int] = []
        self._preloaded: DefaultSiftingBatch | None = None

    def __len__(self) -> int:
        return self.fill + (len(self._preloaded) if self._preloaded is not None else 0)

    @property
    def capacity(self) -> int:
        return self._capacity

    def preload(self, batch: DefaultSiftingBatch) -> None:
        """Samples restored from a checkpoint: written first, when the buffers are created."""
        if self._buffers is not None:
            raise RuntimeError("preload() must come before the first add()")
        if len(batch) > self._capacity:
            raise ValueError(f"{len(batch)} restored pending samples, but at most {self._capacity} can be pending")
        self._preloaded = batch

    def add(
        self,
        batch: DefaultSiftingBatch,
        order: torch.Tensor,
        count: int,
        count_t: torch.Tensor,
        host_indices: list[int] | None,
    ) -> None:
        """Write the rows ``order[:count]`` of ``batch`` (``order`` has a static length m).

        ``count`` is the host's view of the kept count after the loader's bound (rows past
        ``limit`` are dropped, newest first), ``count_t`` the device's before it; they agree
        except under graph extraction, where device values are meaningless anyway.
        """
        m = int(order.shape[0])
        if m > self.rows_per_add:
            raise RuntimeError(f"a batch offers {m} rows, the pending buffers were sized for {self.rows_per_add}")
        if self._buffers is None:
            self._start(batch)
        assert self._buffers is not None and self._fill_t is not None  # made by _start, now or before
        if self.fill + m > self._capacity or (self.limit is not None and self.fill + count > self.limit):
            raise RuntimeError(
                f"internal error: {self.fill} pending rows plus {m} offered exceed the buffers' capacity "
                f"{self._capacity} (limit {self.limit}, {count} kept)"
            )
        if len(batch.leaves) != len(self._buffers):
            raise UnsupportedDataFormatException(
                "cannot accumulate batches of different structure; every source batch must have the same fields"
            )
        slots = self._fill_t + torch.arange(m, device=order.device)
        for i, leaf in enumerate(batch.leaves):
            buf = self._buffers[i]
            if isinstance(buf, Leaf):
                if host_indices is None:
                    raise RuntimeError("host fields need the kept indices on the host")
                self._buffers[i] = Leaf.concat([buf, leaf.select(host_indices[:count])], path=f"leaf {i}")
                continue
            if not isinstance(leaf.value, torch.Tensor):
                raise UnsupportedDataFormatException(
                    f"cannot accumulate samples of leaf {i}: a {type(leaf.value).__name__} after a tensor in an "
                    "earlier batch; every source batch must have the same field types"
                )
            rows = leaf.value.movedim(leaf.axis, 0)
            if tuple(rows.shape[1:]) != tuple(buf.shape[1:]) or rows.dtype != buf.dtype:
                raise UnsupportedDataFormatException(
                    f"cannot accumulate samples of shape {tuple(rows.shape[1:])} ({rows.dtype}) with samples of "
                    f"shape {tuple(buf.shape[1:])} ({buf.dtype}) from an earlier batch; pad every batch to the same "
                    "shape"
                )
            picked = rows.index_select(0, order.to(rows.device))
            self._buffers[i] = buf.index_copy(0, slots.to(buf.device), picked)
        self.fill += count
        self._fill_t = self._fill_t + count_t.to(torch.int64)
        if self.limit is not None:  # the bound is a constant of the graph, the same every step
            self._fill_t = torch.clamp(self._fill_t, max=self.limit)

    def _start(self, like: DefaultSiftingBatch) -> None:
        """Create the buffers, with the restored samples (if any) first.

        Built on the host and uploaded whole, with or without restored samples: a transfer,
        never a graph whose shape depends on how many samples were restored, and the first
        ``add`` then traces the same graph after a resume as in a fresh run.
        """
        pre, self._preloaded = self._preloaded, None
        source = pre if pre is not None else like
        p = len(pre) if pre is not None else 0
        self._structure = source.structure
        self._buffers, self._axes = [], []
        for leaf, current in zip(source.leaves, like.leaves):
            self._axes.append(leaf.axis)
            if not isinstance(current.value, torch.Tensor):
                self._buffers.append(leaf if pre is not None else leaf.select([]))
                continue
            target = current.value.movedim(current.axis, 0)
            host = torch.zeros((self._capacity,) + tuple(target.shape[1:]), dtype=target.dtype)
            if p:
                if not isinstance(leaf.value, torch.Tensor):
                    raise ValueError(
                        f"the checkpoint's pending samples hold a {type(leaf.value).__name__} where the source "
                        "batches after loading hold a tensor"
                    )
                host[:p] = leaf.value.movedim(leaf.axis, 0).cpu().to(target.dtype)
            self._buffers.append(host.to(self.backend.device))
        self.fill = p
        self._fill_t = self.backend.upload([p], torch.int64)

    def pop(self) -> DefaultSiftingBatch | None:
        """The next full batch (device tensors for tensor fields), or None."""
        b = self.batch_size
        if self.fill < b:
            return None
        if self._buffers is None:
            raise RuntimeError("internal error: restored samples must be bound to a source batch before emission")
        leaves: list[Leaf] = []
        for i, buf in enumerate(self._buffers):
            axis = self._axes[i]
            if isinstance(buf, Leaf):
                leaves.append(buf.select(range(b)))
                self._buffers[i] = buf.select(range(b, buf.size()))
                continue
            leaves.append(Leaf(buf[:b].movedim(0, axis), axis))
            self._buffers[i] = torch.cat([buf[b:], buf[:b]])
        assert self._fill_t is not None  # made with the buffers, by _start
        self.fill -= b
        self._fill_t = self._fill_t - b
        return DefaultSiftingBatch(self._structure, leaves, b)

    def bind(self, like: DefaultSiftingBatch) -> None:
        """Create the buffers now (restored samples first), so that they can be emitted before
        anything new is added."""
        if self._buffers is None:
            self._start(like)

    def pending_batch(self) -> DefaultSiftingBatch | None:
        """The pending (not yet emitted) samples as a batch on the device, for inspection.

        Slicing to the fill is a new shape per fill on an XLA device; checkpoints use
        ``pending_on_host`` instead.
        """
        return self._pending(lambda buf: buf)

    def pending_on_host(self) -> DefaultSiftingBatch | None:
        """The pending samples on the CPU: whole buffers are read (a transfer of a shape that
        never changes, so no compilation) and cut on the host."""
        return self._pending(lambda buf: buf.detach().cpu())

    def _pending(self, place) -> DefaultSiftingBatch | None:
        """The pending samples, each buffer passed through ``place`` before it is cut to the fill."""
        if self._preloaded is not None:
            return self._preloaded
        if self._buffers is None or self.fill == 0:
            return None
        leaves = []
        for i, buf in enumerate(self._buffers):
            if isinstance(buf, Leaf):
                leaves.append(buf)
            else:
                leaves.append(Leaf(place(buf)[: self.fill].movedim(0, self._axes[i]), self._axes[i]))
        return DefaultSiftingBatch(self._structure, leaves, self.fill)


class DevicePending(PendingStore):
    """The pending store of the default batch handling on an XLA device.

    Tensor fields go to the device once (the user's own ``.to(device)`` is then a no-op)
    and a short batch is padded so the scoring forward keeps its shape. What is read back
    per source batch: nothing in fixed mode (the kept count is known), the kept count in
    probabilistic mode, plus the kept indices when the batch has host (non-tensor) fields.
    The graph is cut (``backend.sync``) after each source batch's write and after each
    cut batch, so the user's training graph never contains sifting ops and the set of
    compiled graphs does not depend on the data. Under graph extraction nothing read back
    is trusted.
    """

    def __init__(self, batch_size: int, backend: Backend, rows_per_add: int, limit: int | None = None):
        super().__init__(batch_size)
        self.backend = backend
        self.buffers = PendingBuffers(batch_size, backend, rows_per_add, limit)

    def prepare(self, batch: SiftingBatch, source: Any) -> tuple[SiftingBatch, Any]:
        assert isinstance(batch, DefaultSiftingBatch)
        scored = pad_batch(batch_to_device(batch, self.backend.device), self.batch_size)
        return scored, scored.to_user()

    def read_kept(self, sifter: Any, scored: SiftingBatch, out: Any, n: int) -> Kept:
        """Probabilistic mode syncs before its read, so the read transfers results instead
        of re-running the scoring graph."""
        assert isinstance(scored, DefaultSiftingBatch)
        host_fields = has_host_leaves(scored)
        extraction = self.backend.extraction_only
        indices = None
        nonfinite = 0
        if sifter.config.keeps_exact_count:
            count = sifter.rows_taken(n, len(scored))
            if host_fields:
                self.backend.sync()
                indices, nonfinite = sifter.read_selection(out)
        else:
            self.backend.sync()
            if extraction:
                count = sifter.config.fixed_keep_count(n)
            elif host_fields:
                indices, nonfinite = sifter.read_selection(out)
                count = int(indices.shape[0])
            else:
                count, nonfinite = sifter.read_counts(out)
        if extraction:
            indices = list(range(count)) if host_fields else None
            nonfinite = 0
        return Kept(count, nonfinite, indices)

    def add(self, scored: SiftingBatch, out: Any, kept: Kept, n_admitted: int) -> None:
        """Write the kept rows into the device buffers, then cut the graph (asynchronously)."""
        assert isinstance(scored, DefaultSiftingBatch)
        self.buffers.add(scored, out.order, n_admitted, out.count, kept.indices)
        self.backend.sync()

    def pop(self) -> SiftingBatch | None:
        """Cut the next full batch, if one is ready, and sync.

        Batches are cut one at a time, just before they are yielded, so samples of a batch
        not yet handed out stay pending (and in ``state_dict()``).
        """
        batch = self.buffers.pop()
        if batch is not None:
            self.backend.sync()
        return batch

    def num_bound(self) -> int:
        return len(self.buffers)

    def bind(self, like: SiftingBatch) -> None:
        """Restored samples first, and the buffers made now, so they can be emitted before
        anything new is added."""
        if not self.has_unbound:
            return
        super().bind(like)
        assert isinstance(like, DefaultSiftingBatch)
        self.buffers.bind(like)

    def _insert_restored(self, batch: SiftingBatch) -> None:
        assert isinstance(batch, DefaultSiftingBatch)
        self.buffers.preload(batch)  # uploaded whole when the buffers are created

    def pending_batch(self) -> SiftingBatch | None:
        return self.buffers.pending_batch() if len(self.buffers) else None

    def pending_on_host(self) -> SiftingBatch | None:
        """Whole buffers are read (no new graph per pending count) and cut on the host."""
        return self.buffers.pending_on_host() if len(self.buffers) else None
