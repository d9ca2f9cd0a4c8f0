"""Accumulation on the device with static shapes, for the XLA backend.

On an XLA device a ``tensor[host_indices]`` of varying length is a new graph per length.
Here every tensor field of the batch has a staging buffer of fixed capacity
``B + m`` rows (m: rows offered per source batch, P in probabilistic mode, k in fixed
mode). Each source batch writes its ``m`` candidate rows, kept ones first, at the current
fill offset (a device scalar, so no new graph); rows past the kept count land in the
unused tail and are overwritten later. When ``B`` rows are waiting, ``buffer[:B]`` is
emitted and the buffer is rotated by ``B``. All shapes are static, and the host only
needs the kept count: known in fixed mode, one scalar read in probabilistic mode.

Fields that are not tensors (lists of strings, NumPy arrays) stay on the host and need
the kept row indices, i.e. one host read per source batch.
"""

from typing import Any, List, Optional

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.data_model.default_batch import DefaultSiftingBatch, _Leaf
from neuron_sift.exceptions import UnsupportedDataFormatException


def is_device_leaf(leaf: _Leaf) -> bool:
    return isinstance(leaf.value, torch.Tensor)


def batch_to_device(batch: DefaultSiftingBatch, device: torch.device) -> DefaultSiftingBatch:
    """Tensor fields moved to ``device`` (a no-op for tensors already there)."""
    leaves = [
        _Leaf(leaf.value.to(device), leaf.axis) if is_device_leaf(leaf) else leaf for leaf in batch._leaves
    ]
    return DefaultSiftingBatch(batch._spec, leaves, len(batch))


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
    return any(not is_device_leaf(leaf) for leaf in batch._leaves)


class DeviceStaging:
    """Fixed-capacity device buffers that turn kept rows into batches of exactly ``B``."""

    def __init__(self, batch_size: int, backend: Backend):
        self.batch_size = batch_size
        self.backend = backend
        self.fill = 0  # host mirror: decides emission without reading the device
        self._fill_t: Optional[torch.Tensor] = None  # device copy: the write offset
        self._spec: Any = None
        self._buffers: Optional[List[Any]] = None  # per leaf: device tensor, or a host _Leaf of waiting samples
        self._axes: List[int] = []
        self._capacity = 0
        self._preloaded: Optional[DefaultSiftingBatch] = None

    def __len__(self) -> int:
        return self.fill + (len(self._preloaded) if self._preloaded is not None else 0)

    def preload(self, batch: DefaultSiftingBatch) -> None:
        """Samples restored from a checkpoint: staged first, when the buffers are created."""
        if self._buffers is not None:
            raise RuntimeError("preload() must come before the first add()")
        self._preloaded = batch

    def _init(self, batch: DefaultSiftingBatch, m: int) -> None:
        self._spec = batch._spec
        self._fill_t = self.backend.upload([0], torch.int64)
        self._capacity = self.batch_size + m
        self._buffers, self._axes = [], []
        for leaf in batch._leaves:
            self._axes.append(leaf.axis)
            if is_device_leaf(leaf):
                rows = leaf.value.movedim(leaf.axis, 0)
                self._buffers.append(rows.new_zeros((self._capacity,) + tuple(rows.shape[1:])))
            else:
                self._buffers.append(leaf.select([]))

    def add(
        self,
        batch: DefaultSiftingBatch,
        order: torch.Tensor,
        count: int,
        count_t: torch.Tensor,
        host_indices: Optional[List[int]],
    ) -> None:
        """Stage the rows ``order[:count]`` of ``batch`` (``order`` has a static length m).

        ``count`` is the host's view of the kept count, ``count_t`` the device's; they agree
        except under graph extraction, where device values are meaningless anyway.
        """
        m = int(order.shape[0])
        if self._buffers is None:
            self._init(batch, m)
            if self._preloaded is not None:
                self._insert_preloaded()
        if self.batch_size + m > self._capacity:
            raise RuntimeError(f"staging capacity {self._capacity} exceeded by a batch offering {m} rows")
        if len(batch._leaves) != len(self._buffers):
            raise UnsupportedDataFormatException(
                "cannot accumulate batches of different structure; every source batch must have the same fields"
            )
        slots = self._fill_t + torch.arange(m, device=order.device)
        for i, leaf in enumerate(batch._leaves):
            buf = self._buffers[i]
            if isinstance(buf, _Leaf):
                if host_indices is None:
                    raise RuntimeError("host fields need the kept indices on the host")
                self._buffers[i] = _Leaf.concat([buf, leaf.select(host_indices)], path=f"leaf {i}")
                continue
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

    def _insert_preloaded(self) -> None:
        pre, self._preloaded = self._preloaded, None
        p = len(pre)
        if p >= self.batch_size:
            raise ValueError(f"{p} restored pending samples, but fewer than the batch size {self.batch_size} can wait")
        slots = torch.arange(p, device=self.backend.device)
        for i, leaf in enumerate(pre._leaves):
            buf = self._buffers[i]
            if isinstance(buf, _Leaf):
                self._buffers[i] = leaf
                continue
            rows = leaf.value.movedim(leaf.axis, 0).to(buf.device, buf.dtype)
            self._buffers[i] = buf.index_copy(0, slots, rows)
        self.fill = p
        self._fill_t = self.backend.upload([p], torch.int64)

    def pop(self) -> Optional[DefaultSiftingBatch]:
        """The next full batch (device tensors for tensor fields), or None."""
        b = self.batch_size
        if self.fill < b:
            return None
        leaves: List[_Leaf] = []
        for i, buf in enumerate(self._buffers):
            axis = self._axes[i]
            if isinstance(buf, _Leaf):
                leaves.append(buf.select(range(b)))
                self._buffers[i] = buf.select(range(b, buf.size()))
                continue
            leaves.append(_Leaf(buf[:b].movedim(0, axis), axis))
            self._buffers[i] = torch.cat([buf[b:], buf[:b]])
        self.fill -= b
        self._fill_t = self._fill_t - b
        return DefaultSiftingBatch(self._spec, leaves, b)

    def pending_batch(self) -> Optional[DefaultSiftingBatch]:
        """The waiting (not yet emitted) samples as a batch, for inspection and checkpoints."""
        if self._preloaded is not None:
            return self._preloaded
        if self._buffers is None or self.fill == 0:
            return None
        leaves = []
        for i, buf in enumerate(self._buffers):
            axis = self._axes[i]
            if isinstance(buf, _Leaf):
                leaves.append(buf)
            else:
                leaves.append(_Leaf(buf[: self.fill].movedim(0, axis), axis))
        return DefaultSiftingBatch(self._spec, leaves, self.fill)
