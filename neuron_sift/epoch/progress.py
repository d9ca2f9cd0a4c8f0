"""The per-epoch iterator: how far the current epoch has come, and what it yields next.

Why progress is counted at ``weighted_loss`` and not at ``yield``: the DataLoader's workers
and wrappers such as ``MpDeviceLoader`` pull batches ahead of the training loop, so a
yielded batch is not a trained one. ``position`` counts the batches whose losses are
recorded; a checkpoint resumes there, and the batches pulled ahead but never trained are
yielded again.

An epoch is planned at the first ``next()`` (or by ``start_epoch()`` before it), not at
``iter()``: Lightning calls ``iter()`` once just to check a loader, and planning then would
spend an epoch's draws. A new ``iter()`` voids the iterators before it, so two of them
never interleave one epoch's batches.
"""

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from neuron_sift.epoch.opening import EpochOpener
from neuron_sift.epoch.pairing import PairingQueue
from neuron_sift.epoch.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.source import PlannedBatchSampler

logger = logging.getLogger("neuron_sift.epoch.loader")


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
        self.position = 0  # batches of the current epoch whose losses are recorded
        self.in_progress = False
        self.resuming = False  # a checkpoint's epoch in progress: the next iter() continues it
        self.planned_ahead = False  # start_epoch() planned the next epoch; iter() runs it
        self._token = 0

    # -- lengths ---------------------------------------------------------------------------

    def known_length(self) -> int | None:
        """This rank's batches of the epoch that the next ``iter()`` runs or that is running
        (only those left when resuming); None when that epoch is not planned yet."""
        if self.resuming:
            return len(self.batches) - self.position
        if self.in_progress or self.planned_ahead:
            return len(self.batches)
        return None

    def left_in_current(self) -> int:
        """Batches of the epoch in progress still waiting for their losses (0: none)."""
        if self.in_progress and self.position < len(self.batches):
            return len(self.batches) - self.position
        return 0

    # -- iteration -------------------------------------------------------------------------

    def start_epoch(self) -> EpochPlan:
        if not self.planned_ahead and not self.resuming:
            self._open()
            self.planned_ahead = True
        if self.plan is None:  # a resume always brings its plan
            raise RuntimeError("EpochSiftingDataloader: no epoch is planned")
        return self.plan

    def iterate(self, carry_pending: bool = False) -> Iterator[Any]:
        self._token += 1
        return self._iterate(self._token, carry_pending)

    def _iterate(self, token: int, carry_pending: bool) -> Iterator[Any]:
        if self.resuming:
            self.resuming = False
            start = self.position
        else:
            if not self.planned_ahead:
                self._open()
            start = 0
        self.planned_ahead = False
        dropped = 0 if carry_pending else self.pairing.clear()
        if dropped:
            logger.warning(
                "EpochSiftingDataloader: %d yielded batch(es) never got their losses through weighted_loss; "
                "their samples keep their previous scores",
                dropped,
            )
        self.sampler.batches = self.batches
        self.sampler.start = start
        j = start
        for batch in self.loader:
            if token != self._token:
                raise RuntimeError(
                    "EpochSiftingDataloader: a new iteration was started; this iterator is no longer valid"
                )
            self.pairing.push(self.batches[j], self.epochs_started)
            j += 1
            yield batch
        if token == self._token:
            self.in_progress = False

    def _open(self) -> None:
        self.plan, self.batches = self.opener.open(self.epochs_started, self.plan)
        self.epochs_started += 1
        self.position = 0
        self.in_progress = True

    def recorded(self, epoch_tag: int) -> None:
        """A batch's losses are all recorded; ``epoch_tag``: the epoch it was yielded in (one
        carried over from the epoch before does not move this epoch's position)."""
        if epoch_tag == self.epochs_started:
            self.position += 1

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The plan in progress and the position in it; an epoch whose batches all have their
        losses is saved as finished, so a resume starts the next one."""
        return {
            "epochs_started": self.epochs_started,
            "in_progress": self.left_in_current() > 0,
            "position": self.position,
            "plan": None if self.plan is None else self.plan.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs_started = int(state["epochs_started"])
        self.position = int(state["position"])
        self.plan = None if state["plan"] is None else EpochPlan.from_state(state["plan"])
        self.batches = self.planner.rank_batches_of(self.plan) if self.plan is not None else []
        self.in_progress = bool(state["in_progress"])
        self.resuming = self.in_progress
        self.planned_ahead = False
        self._token += 1  # iterators started before loading are void
