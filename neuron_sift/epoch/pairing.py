"""Pairing recorded losses with the samples of the batch they were computed on.

The contract (README, "Epoch-level sifting"): the loader pushes the sample ids of every
batch it yields, in the order it yields them; each ``weighted_loss`` call takes ids from
the front, as many as it has losses. Batches reach the training loop in the order they
were yielded (a DataLoader with workers keeps the sampler's order unless ``in_order=False``,
which the loader refuses; ``MpDeviceLoader`` and other prefetching wrappers keep it too),
so the oldest batch still waiting for its loss is the one being trained on, however far
ahead a wrapper or the workers have pulled.

- one call per batch: the loss vector must have exactly the batch's length;
- micro-batches: split a batch in order and pass ``partial=True`` with each part; the
  batch is done when its last sample has its loss;
- a wrong length, a call with no batch waiting, or the same loss tensor passed twice
  raise ``LossOutputException`` before anything is recorded: never a silent
  misattribution.

The queue also keeps the counts of pairs made (batches yielded and recorded, losses
recorded, batches dropped unpaired): it is where each of those events happens.
"""

import threading
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

from neuron_sift.exceptions import LossOutputException

COUNTS = ("losses_recorded", "batches_recorded", "batches_yielded")


def as_per_sample(per_sample: Any) -> torch.Tensor:
    """``per_sample`` as ``[n]`` floating losses, or ``LossOutputException`` saying what the
    contract is: a wrong shape must fail before a single score is written."""
    if not isinstance(per_sample, torch.Tensor):
        raise LossOutputException(f"weighted_loss needs a tensor of per-sample losses, got {type(per_sample).__name__}")
    if per_sample.dim() == 2 and per_sample.shape[1] == 1:
        per_sample = per_sample[:, 0]
    if per_sample.dim() != 1:
        raise LossOutputException(
            f"weighted_loss needs one loss per sample, shape [n] (or [n, 1]), got {list(per_sample.shape)}; "
            "use reduction='none' and reduce per-token losses to one value per sample"
        )
    if not per_sample.is_floating_point():
        raise LossOutputException(f"weighted_loss needs floating-point losses, got dtype {per_sample.dtype}")
    return per_sample


class PairingQueue:
    """FIFO of yielded batches' ids; thread-safe (a prefetching wrapper pushes from its own thread)."""

    def __init__(self) -> None:
        self._queue: deque[list[Any]] = deque()  # [ids, offset, tag]
        self._lock = threading.Lock()
        self._last: weakref.ref[Any] | None = None
        self._counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self.dropped_batches = 0  # yielded but never paired (counted when an epoch restarts)

    @property
    def counts(self) -> dict[str, int]:
        """Losses and batches recorded, batches yielded (a copy)."""
        with self._lock:
            return dict(self._counts)

    def push(self, ids: np.ndarray, tag: int = 0) -> None:
        """A yielded batch's ids; ``tag`` (the epoch) comes back from ``take``."""
        with self._lock:
            self._queue.append([ids, 0, tag])
            self._counts["batches_yielded"] += 1

    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)

    def clear(self) -> int:
        """Drop every waiting batch (a new epoch began); returns how many were dropped."""
        with self._lock:
            n = len(self._queue)
            self._queue.clear()
            self.dropped_batches += n
            self._last = None
            return n

    def take(self, loss_tensor: torch.Tensor, n: int, partial: bool) -> tuple[np.ndarray, bool, int]:
        """The ids the next ``n`` losses belong to, whether their batch is now complete, and its tag."""
        with self._lock:
            last = self._last() if self._last is not None else None
            if last is not None and last is loss_tensor:
                raise LossOutputException(
                    "weighted_loss was given the same loss tensor twice: call it once per batch (or once per "
                    "micro-batch with partial=True)"
                )
            if not self._queue:
                raise LossOutputException(
                    "weighted_loss was called but no yielded batch is waiting for its loss: one call per batch "
                    "of this loader (a second call for the same batch, or a loss of a batch from elsewhere?)"
                )
            entry = self._queue[0]
            ids, offset, tag = entry
            left = len(ids) - offset
            if n > left or (n < left and not partial):
                where = f"{left} of its {len(ids)} samples still waiting" if offset else f"{len(ids)} samples"
                hint = (
                    " If the batch is split into micro-batches, pass partial=True with each part." if n < left else ""
                )
                raise LossOutputException(
                    f"weighted_loss got {n} losses but the batch they belong to has {where}; pass one loss per "
                    f"sample of the batch (reduction='none').{hint}"
                )
            part = ids[offset : offset + n]
            entry[1] = offset + n
            done = entry[1] == len(ids)
            if done:
                self._queue.popleft()
                self._counts["batches_recorded"] += 1
            self._counts["losses_recorded"] += n
            try:
                self._last = weakref.ref(loss_tensor)
            except TypeError:
                self._last = None
            return part, done, tag

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """The counts. Waiting batches are not kept: a resumed run yields them again."""
        with self._lock:
            return {**self._counts, "dropped_batches": self.dropped_batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._queue.clear()
            self._last = None
            self._counts = {k: int(state[k]) for k in COUNTS}
            self.dropped_batches = int(state["dropped_batches"])
