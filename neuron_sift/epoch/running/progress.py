"""The per-epoch iterator: how far the current epoch has come, and what it yields next.

Why progress is counted at ``weighted_loss`` and not at ``yield``: the DataLoader's workers
and wrappers such as ``MpDeviceLoader`` pull batches ahead of the training loop, so a
yielded batch is not a trained one. ``position`` counts the batches whose losses are
recorded (or that the loop skipped with ``skip_batch()``); a checkpoint resumes there, and
the batches pulled ahead but never trained are yielded again.

An epoch is planned at the first ``next()`` (or by ``start_epoch()`` before it), not at
``iter()``: Lightning calls ``iter()`` once just to check a loader, and planning then would
spend an epoch's draws. And an epoch is spent only once a loss of it has been recorded:
``next(iter(loader))`` to look at a batch leaves the plan in place, and the next ``iter()``
runs it from where it stood, so a peek does not shift the run by an epoch. An iteration
left after some losses (a ``break``, an exception caught around the loop) ends its epoch:
the next ``iter()`` plans the next one and says how many batches were never trained.

The end of an epoch follows the same rule as the per-batch loader: an epoch is open until
its iteration has ended and no batch of it waits for its losses. A checkpoint of an open
epoch resumes into its rest, which is empty when it was taken after the last batch's loss
but before the iteration ended (a loop saving every ``k`` steps hits that point); one
taken after the iteration ended starts the next epoch. So a loop resumed "at the epoch
you were in" takes exactly the steps of the uninterrupted run.

A new ``iter()`` (or a ``load_state_dict()``) voids the iterators before it, so two of them
never interleave one epoch's batches: the package's one iterator-lifetime rule
(``neuron_sift.shared.iterators``).
"""

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from neuron_sift.epoch.planning.plan_checks import check_progress_state
from neuron_sift.epoch.planning.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.running.opening import EpochOpener
from neuron_sift.epoch.running.pairing import PairingQueue, Waiting
from neuron_sift.epoch.user_data.source_loader import PlannedBatchSampler
from neuron_sift.shared.iterators import IteratorGeneration
from neuron_sift.shared.logs import EPOCH_LOGGER

logger = logging.getLogger(EPOCH_LOGGER)


def _named(batches: list[Waiting], most: int = 5) -> str:
    names = ", ".join(w.where() for w in batches[:most])
    return names + (f" and {len(batches) - most} more" if len(batches) > most else "")


class EpochProgress:
    """The epochs started, the current plan and this rank's batches of it, and the position
    in them; iterates ``loader`` (the user's loader around ``sampler``)."""

    def __init__(
        self,
        loader: Iterable[Any],
        sampler: PlannedBatchSampler,
        planner: EpochPlanner,
        opener: EpochOpener,
        pairing: PairingQueue,
    ) -> None:
        self.loader = loader
        self.sampler = sampler
        self.planner = planner
        self.opener = opener
        self.pairing = pairing
        self.epochs_started = 0
        self.plan: EpochPlan | None = None
        self.batches: list[np.ndarray] = []
        self.position = 0  # batches of the current epoch whose losses are recorded (or skipped)
        self.in_progress = False  # the current epoch is planned and its iteration has not ended
        self.touched = False  # a loss of the current epoch arrived since its latest iter() (or its planning)
        self.loaded = False  # the current epoch is a checkpoint's
        self._generation = IteratorGeneration("EpochSiftingDataloader")

    # -- where the epoch stands ------------------------------------------------------------

    @property
    def current_epoch(self) -> int:
        """The 0-based index of the epoch started last (-1 before the first)."""
        return self.epochs_started - 1

    def runs_again(self) -> bool:
        """Whether the next ``iter()`` runs the current plan from ``position`` instead of
        planning the next epoch: it was planned ahead, only peeked at, or loaded."""
        return self.in_progress and not self.touched

    @property
    def resuming(self) -> bool:
        """Whether the next ``iter()`` continues a checkpoint's epoch in progress."""
        return self.loaded and self.runs_again()

    def is_open(self) -> bool:
        """Whether the current epoch is not over: its iteration has not ended, or a wrapper
        that pulled its last batches ahead is still training them."""
        return self.in_progress or bool(self.plan is not None and self.pairing.waiting_of(self.current_epoch))

    def finished(self) -> bool:
        """Whether every batch of the current epoch on this rank has its losses (or was skipped)."""
        return self.plan is not None and self.position >= len(self.batches)

    # -- lengths ---------------------------------------------------------------------------

    def known_length(self) -> int | None:
        """This rank's batches of the epoch that the next ``iter()`` runs or that is running
        (only those left when it runs again from a position); None when that epoch is not
        planned yet."""
        if self.runs_again():
            return len(self.batches) - self.position
        if self.in_progress:
            return len(self.batches)
        return None

    def left_in_current(self) -> int:
        """Batches of the open epoch still waiting for their losses (0: none, or no open epoch)."""
        return len(self.batches) - self.position if self.is_open() else 0

    # -- iteration -------------------------------------------------------------------------

    def start_epoch(self) -> EpochPlan:
        if not self.runs_again():
            self._leave_current()
            self._open()
        if self.plan is None:  # a resume always brings its plan
            raise RuntimeError("EpochSiftingDataloader: no epoch is planned")
        return self.plan

    def iterate(self, carry_pending: bool = False) -> Iterator[Any]:
        return self._iterate(self._generation.start(), carry_pending)

    def _iterate(self, generation: int, carry_pending: bool) -> Iterator[Any]:
        if self.runs_again():
            self.pairing.discard(self.current_epoch)  # a peek's batches: they come again now
        else:
            self._leave_current()
            self._open()
        start = self.position
        dropped = [] if carry_pending else self.pairing.clear()
        if dropped:
            logger.warning(
                "EpochSiftingDataloader: %d yielded batch(es) never got their losses through weighted_loss (%s); "
                "their samples keep their previous scores",
                len(dropped),
                _named(dropped),
            )
        self.pairing.new_iteration()
        self.sampler.batches = self.batches
        self.sampler.start = start
        j = start
        for batch in self.loader:
            self._generation.check(generation)
            self.pairing.push(self.batches[j], self.current_epoch, j)
            j += 1
            yield batch
        if self._generation.is_current(generation):
            self.in_progress = False
            self.pairing.iteration_ended()

    def _leave_current(self) -> None:
        """Before the next epoch is planned: say so if the current one was left with batches
        never trained (its iteration abandoned after some losses)."""
        if not self.in_progress or self.plan is None or self.finished():
            return
        left = len(self.batches) - self.position
        logger.warning(
            "EpochSiftingDataloader: epoch %d (0-based) was left after %d of its %d batches on this rank had their "
            "losses (a break, or an exception caught around the loop); the other %d were never trained. The next "
            "epoch is planned now",
            self.current_epoch,
            self.position,
            len(self.batches),
            left,
        )

    def _open(self) -> None:
        carried = bool(self.plan is not None and self.pairing.waiting_of(self.current_epoch))
        self.plan, self.batches = self.opener.open(self.epochs_started, self.plan, carried)
        self.epochs_started += 1
        self.position = 0
        self.in_progress = True
        self.touched = False
        self.loaded = False

    def recorded(self, epoch: int, done: bool) -> None:
        """Losses of a batch arrived (``done``: all of them, or it was skipped); ``epoch``:
        the epoch it was yielded in, 0-based (one carried over from the epoch before does not
        move this epoch's position)."""
        if epoch == self.current_epoch:
            self.touched = True
            if done:
                self.position += 1

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The plan in progress and the position in it; an open epoch (see the module's
        docstring) is saved in progress, even with nothing left, so a resume takes its rest."""
        return {
            "epochs_started": self.epochs_started,
            "in_progress": self.is_open(),
            "position": self.position,
            "plan": None if self.plan is None else self.plan.state_dict(),
        }

    def check_state(self, state: Any) -> None:
        """Refuse a state this loader's rank (its planner's) cannot resume (``plan_checks``),
        naming the field."""
        check_progress_state(self.planner, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.epochs_started = int(state["epochs_started"])
        self.position = int(state["position"])
        self.plan = None if state["plan"] is None else EpochPlan.from_state(state["plan"])
        self.batches = self.planner.rank_batches_of(self.plan) if self.plan is not None else []
        self.in_progress = bool(state["in_progress"])
        self.touched = False
        self.loaded = self.in_progress
        self._generation.void_all()
