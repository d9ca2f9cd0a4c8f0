"""Recording a training step's losses: the pairing with the waiting batch, the score writes,
the loss weights, the epoch's position. ``EpochSiftingDataloader.weighted_loss``,
``weighted_batch_loss`` and ``skip_batch`` are this part's three calls.

Why a part of its own: what a step does with its losses is the same whether the loss has a
value per sample or only one for the whole batch (a contrastive loss): pair it with the
oldest waiting batch, write the scores, weigh the loss, move the epoch on. Kept apart from
the loader, the loader keeps arguments, lengths and the state API only.

Losses with no per-sample value (``weighted_batch``): every sample of the batch is scored by
the moving average of the batch losses it appeared in (the rule of BLS, batch-level loss
scoring), each new one weighted ``score_smoothing`` (``BATCH_LOSS_SMOOTHING`` when the config
has none), and the batch's loss is returned weighted by the mean weight of its samples. An
approximation: the weighted loss of a pruned epoch is then unbiased only where a batch's
loss is the mean of per-sample terms; a contrastive loss couples its samples, and a pruned
batch changes every sample's negatives.
"""

import time
from collections.abc import Callable

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.running.history import EpochHistory
from neuron_sift.epoch.running.pairing import PairingQueue, Taken, as_per_sample
from neuron_sift.epoch.running.progress import EpochProgress
from neuron_sift.epoch.scores.owned_shares import OwnedShares
from neuron_sift.epoch.scores.rank_shares import RankShares
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.exceptions import LossOutputException

BATCH_LOSS_SMOOTHING = 0.5  # a new batch loss's weight in its samples' scores, without score_smoothing


class LossRecorder:
    """The step's side of the loader's parts. ``backend_for``: the loader's backend for the
    losses' device (placing the tables with the first losses)."""

    def __init__(
        self,
        pairing: PairingQueue,
        planner: EpochPlanner,
        tables: ScoreTables,
        shares: RankShares | OwnedShares,
        progress: EpochProgress,
        history: EpochHistory,
        backend_for: Callable[[torch.device], Backend],
    ) -> None:
        self.pairing = pairing
        self.planner = planner
        self.tables = tables
        self.shares = shares
        self.progress = progress
        self.history = history
        self.backend_for = backend_for

    def _check_device(self, losses: torch.Tensor, call: str) -> None:
        backend = self.backend_for(losses.device)
        if not backend.same_device(losses.device, backend.device):
            raise LossOutputException(
                f"{call} got losses on {losses.device} but the score tables live on {self.tables.device}"
            )

    def _done(self, taken: Taken, start: float) -> None:
        if taken.epoch != self.progress.current_epoch:  # a batch carried from the previous epoch
            self.shares.carried_over(taken.ids)
        self.progress.recorded(taken.epoch, taken.done)
        self.history.spent("weighted_loss", time.perf_counter() - start)

    def weighted(self, per_sample: torch.Tensor, partial: bool) -> torch.Tensor:
        """``EpochSiftingDataloader.weighted_loss``."""
        start = time.perf_counter()
        per_sample = as_per_sample(per_sample)
        self._check_device(per_sample, "weighted_loss")
        taken = self.pairing.take(per_sample, per_sample.shape[0], partial)
        slots = self.planner.slots(taken.ids)  # the ids themselves, or this rank's slots of a sharded table
        out = self.tables.weighted_mean(slots, per_sample, taken.epoch, taken.batch_size)
        self._done(taken, start)
        return out

    def weighted_batch(self, batch_loss: torch.Tensor, smoothing: float | None) -> torch.Tensor:
        """``EpochSiftingDataloader.weighted_batch_loss``."""
        start = time.perf_counter()
        if not isinstance(batch_loss, torch.Tensor) or batch_loss.dim() != 0 or not batch_loss.is_floating_point():
            what = (
                f"a {batch_loss.dtype} tensor of shape {list(batch_loss.shape)}"
                if isinstance(batch_loss, torch.Tensor)
                else type(batch_loss).__name__
            )
            raise LossOutputException(
                f"weighted_batch_loss needs the batch's loss as one floating value (a 0-dim tensor), got {what}; "
                "for a loss with one value per sample use weighted_loss"
            )
        self._check_device(batch_loss, "weighted_batch_loss")
        n = self.pairing.waiting_size()
        taken = self.pairing.take(batch_loss, n, False)
        slots = self.planner.slots(taken.ids)
        each = batch_loss.detach().to(torch.float32).expand(n)
        weights = self.tables.record(slots, each, taken.epoch, BATCH_LOSS_SMOOTHING if smoothing is None else smoothing)
        self._done(taken, start)
        dtype = torch.promote_types(batch_loss.dtype, torch.float32)
        return batch_loss.to(dtype) * weights.to(dtype).mean()

    def skip(self) -> None:
        """``EpochSiftingDataloader.skip_batch``."""
        self.progress.recorded(self.pairing.skip(), True)
