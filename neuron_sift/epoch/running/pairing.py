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
- a batch the loop leaves out: ``skip_batch()`` before moving on (its samples keep their
  previous scores);
- a wrong length, a call with no batch waiting, or the same loss tensor passed twice
  raise ``LossOutputException`` before anything is recorded: never a silent
  misattribution.

Why a skipped batch is caught at the next yield: a loop that ``continue``s past a batch
without its loss would hand the next batch's losses to the skipped batch's ids, and
nothing in the losses tells them apart. What does tell is the queue's depth: right after
a yield it is how many batches the loop holds without their losses, its look-ahead (1 for
a plain loop, 2 for Lightning's one-batch prefetch, up to ``k`` for gradient accumulation
that pulls ``k`` batches first). The look-ahead is given (``lookahead``) or learned: it is
the depth reached before the run's first loss, and it is known once that loss arrives
while the iteration still had batches to give (an iteration that ran out first, such as a
resumed epoch's short rest, only bounds it from below: learning goes on). Once known, a
yield that would leave more batches waiting means one was passed over, and the yield
raises before any loss can go to the wrong samples. Until then a batch left out cannot be
told from a deeper look-ahead: the first batch of a run (or of a resumed run) skipped
without ``skip_batch()`` goes unnoticed until its epoch ends (the unpaired-batch
warning). A wrapper that pulls from the loader in its own thread prefetches as far as its
thread runs, not a fixed depth: without ``lookahead`` the check is off for it (a
one-time note in the log says so).

The queue also keeps the counts of pairs made (batches yielded, recorded and skipped,
losses recorded, batches dropped unpaired): it is where each of those events happens.
"""

import logging
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from neuron_sift.exceptions import LossOutputException
from neuron_sift.shared.checkpoints import require
from neuron_sift.shared.counts import CountSet
from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.shared.state_checks import invalid, need_int, need_mapping
from neuron_sift.shared.validation import positive_int

logger = logging.getLogger(EPOCH_LOGGER)


@dataclass
class PairingCounts(CountSet):
    """The pairs made: losses and batches recorded, batches skipped and yielded."""

    NEWER = ("batches_skipped",)  # a state from before skip_batch() skipped none
    IGNORED = ("dropped_batches",)  # saved beside the counts, restored by the queue itself
    PART = "pairing"

    losses_recorded: int = 0
    batches_recorded: int = 0
    batches_skipped: int = 0
    batches_yielded: int = 0


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


def check_lookahead(lookahead: Any) -> int | None:
    """The ``lookahead`` argument as an int >= 1 or None, or a ``ValueError`` naming it."""
    what = "the most batches the loop holds without their losses; None: learned from the loop"
    return positive_int(lookahead, "lookahead", allow_none=True, what=what)


@dataclass
class Waiting:
    """A yielded batch still waiting for (some of) its losses."""

    ids: np.ndarray
    epoch: int  # the 0-based index of the epoch it was yielded in
    index: int  # its 0-based index among this rank's batches of that epoch
    offset: int = 0  # samples whose losses are recorded

    def where(self) -> str:
        return f"batch {self.index} of epoch {self.epoch} (0-based)"


@dataclass
class Taken:
    """What one ``weighted_loss`` call pairs with: the ids, their batch's size, whether the
    batch is now complete, and the epoch it was yielded in (0-based)."""

    ids: np.ndarray
    batch_size: int
    done: bool
    epoch: int


class PairingQueue:
    """FIFO of yielded batches' ids; thread-safe (a prefetching wrapper pushes from its own thread)."""

    def __init__(self, lookahead: int | None = None) -> None:
        self._queue: deque[Waiting] = deque()
        self._lock = threading.Lock()
        self._last: weakref.ref[Any] | None = None
        self._counts = PairingCounts()
        self.dropped_batches = 0  # yielded but never paired (counted when an epoch restarts)
        self.lookahead = check_lookahead(lookahead)
        self._learned = 0  # the deepest queue seen while learning the look-ahead
        self._known = False  # the look-ahead is learned: a deeper queue means a skipped batch
        self._ended = False  # the current iteration has given its last batch
        self._loss_thread: int | None = None  # the thread that calls weighted_loss
        self._foreign = False  # a wrapper pulls from the loader in a thread of its own

    @property
    def counts(self) -> dict[str, int]:
        """Losses and batches recorded, batches skipped and yielded (a copy)."""
        with self._lock:
            return self._counts.as_dict()

    def new_iteration(self) -> None:
        """An ``iter()`` began (its batches may go deeper than the last iteration's end did)."""
        with self._lock:
            self._ended = False

    def iteration_ended(self) -> None:
        """The current iteration gave its last batch: a loss arriving now does not tell the
        loop's look-ahead (the loop may have wanted more batches than were left)."""
        with self._lock:
            self._ended = True

    def push(self, ids: np.ndarray, epoch: int = 0, index: int = 0) -> None:
        """A batch about to be yielded in ``epoch`` (0-based), which comes back from ``take``.

        Raises:
            LossOutputException: the yield would leave more batches without their losses than
                the loop's look-ahead: the oldest one was passed over without ``skip_batch()``.
        """
        with self._lock:
            depth = len(self._queue) + 1
            if self._loss_thread is not None and threading.get_ident() != self._loss_thread:
                if not self._foreign and self.lookahead is None:
                    logger.info(
                        "EpochSiftingDataloader: batches are pulled from another thread than the one calling "
                        "weighted_loss (a prefetching wrapper); a batch skipped without skip_batch() is not "
                        "detected unless the loader is given lookahead="
                    )
                self._foreign = True
            limit = self.lookahead if self.lookahead is not None else self._learned
            if self.lookahead is None and not self._known:
                self._learned = max(self._learned, depth)
            elif depth > limit and (self.lookahead is not None or not self._foreign):
                skipped = self._queue[0]
                raise LossOutputException(
                    f"EpochSiftingDataloader: {skipped.where()} was yielded but got no loss through weighted_loss "
                    f"before the next batch was requested (this loop holds at most {limit} batch(es) without their "
                    "losses); its losses would go to the wrong samples. To leave a batch out, call "
                    "loader.skip_batch() before `continue`, or call weighted_loss first and skip only the "
                    "optimizer step; a loop that prefetches a varying number of batches passes lookahead= "
                    "to the loader"
                )
            self._queue.append(Waiting(ids, epoch, index))
            self._counts.batches_yielded += 1

    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)

    def waiting_size(self) -> int:
        """The samples of the oldest waiting batch still without losses.

        Raises:
            LossOutputException: no yielded batch is waiting.
        """
        with self._lock:
            if not self._queue:
                raise LossOutputException(
                    "a batch loss was passed but no yielded batch is waiting for its loss: one call per batch of "
                    "this loader (a second call for the same batch, or a loss of a batch from elsewhere?)"
                )
            entry = self._queue[0]
            return len(entry.ids) - entry.offset

    def waiting_of(self, epoch: int) -> list[int]:
        """The batch indices of epoch ``epoch`` still waiting, oldest first."""
        with self._lock:
            return [w.index for w in self._queue if w.epoch == epoch]

    def clear(self) -> list[Waiting]:
        """Drop every waiting batch (a new epoch began); returns the dropped ones, oldest first."""
        with self._lock:
            dropped = list(self._queue)
            self._queue.clear()
            self.dropped_batches += len(dropped)
            self._last = None
            return dropped

    def discard(self, epoch: int) -> int:
        """Forget the waiting batches of epoch ``epoch`` without counting them as unpaired: a
        peek whose epoch runs again from its start; returns how many."""
        with self._lock:
            keep = deque(w for w in self._queue if w.epoch != epoch)
            n = len(self._queue) - len(keep)
            self._queue = keep
            return n

    def _loss_arrives(self) -> None:
        if not self._ended:
            self._known = True
        self._loss_thread = threading.get_ident()

    def take(self, loss_tensor: torch.Tensor, n: int, partial: bool) -> Taken:
        """The ids the next ``n`` losses belong to (see ``Taken``)."""
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
            size, offset = len(entry.ids), entry.offset
            left = size - offset
            if n > left or (n < left and not partial):
                where = f"{left} of its {size} samples still waiting" if offset else f"{size} samples"
                hint = (
                    " If the batch is split into micro-batches, pass partial=True with each part." if n < left else ""
                )
                raise LossOutputException(
                    f"weighted_loss got {n} losses but the batch they belong to has {where}; pass one loss per "
                    f"sample of the batch (reduction='none').{hint}"
                )
            self._loss_arrives()
            part = entry.ids[offset : offset + n]
            entry.offset = offset + n
            done = entry.offset == size
            if done:
                self._queue.popleft()
                self._counts.batches_recorded += 1
            self._counts.losses_recorded += n
            try:
                self._last = weakref.ref(loss_tensor)
            except TypeError:
                self._last = None
            return Taken(part, size, done, entry.epoch)

    def skip(self) -> int:
        """The oldest waiting batch gets no (more) losses; returns its epoch (0-based).

        Raises:
            LossOutputException: no yielded batch is waiting.
        """
        with self._lock:
            if not self._queue:
                raise LossOutputException(
                    "skip_batch() was called but no yielded batch is waiting for its loss: call it once for a "
                    "batch the loop leaves out, instead of weighted_loss"
                )
            entry = self._queue.popleft()
            self._loss_arrives()
            self._counts.batches_skipped += 1
            self._last = None
            return entry.epoch

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """The counts. Waiting batches are not kept: a resumed run yields them again."""
        with self._lock:
            return {**self._counts.state_dict(), "dropped_batches": self.dropped_batches}

    @staticmethod
    def check_state(state: Any) -> None:
        """Refuse counts this queue cannot restore, before any part of a loader is changed
        (static: no queue's context is needed)."""
        counts = {key: need_int(value, f"pairing.{key}", 0) for key, value in need_mapping(state, "pairing").items()}
        PairingCounts().check_state(state)
        require(state, ("dropped_batches",), "the pairing state")
        done = counts["batches_recorded"] + counts.get("batches_skipped", 0)
        if done > counts["batches_yielded"]:
            invalid(
                "pairing.batches_yielded",
                f"is {counts['batches_yielded']}, fewer than the {done} batches recorded or skipped (each was yielded)",
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        with self._lock:
            self._queue.clear()
            self._last = None
            self._counts.load_state_dict(state)
            self.dropped_batches = int(state["dropped_batches"])
            self._learned, self._known, self._ended = 0, False, False  # learned again after a resume
