"""What kind each epoch is and how many batches it trains: the planner's counts.

The one source of ``len()``, ``planned_steps()`` and the integrations' schedule lengths, kept
apart from the drawing of plans (``planner.py``) so both stay readable; a mixin because every
count reads the same settings the plans are drawn with (the run's ``PlanSettings``, read
through, never copied), and a sharded table's planner (``sharded_planner.py``) overrides
only what it counts differently.
"""

import math

import numpy as np
import torch

from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.selection.policies import EpochPolicy
from neuron_sift.shared.validation import positive_int
from neuron_sift.sift_config.epoch_config import EpochSiftConfig


class EpochCounts:
    """Counts of an ``EpochPlanner``, and its settings: each read through the run's
    ``plan_settings`` (``plan.PlanSettings``), the policy's entry built from its config."""

    plan_settings: PlanSettings
    policy: EpochPolicy

    # -- the run's settings ----------------------------------------------------------------

    @property
    def config(self) -> EpochSiftConfig:
        return self.plan_settings.config

    @property
    def n(self) -> int:
        """Samples of the dataset (every table and plan speaks its ids)."""
        return self.plan_settings.n

    @property
    def support(self) -> np.ndarray | None:
        """The sorted dataset ids the user's sampler yields (None: all ``n``)."""
        return self.plan_settings.support

    @property
    def m(self) -> int:
        """Samples of the support: every count is of these."""
        support = self.plan_settings.support
        return self.plan_settings.n if support is None else int(support.shape[0])

    @property
    def ordered(self) -> bool:
        return self.plan_settings.ordered

    @property
    def batch_size(self) -> int:
        return self.plan_settings.batch_size

    @property
    def drop_last(self) -> bool:
        return self.plan_settings.drop_last

    @property
    def num_epochs(self) -> int | None:
        return self.plan_settings.num_epochs

    @property
    def world_size(self) -> int:
        return self.plan_settings.world_size

    @property
    def rank(self) -> int:
        return self.plan_settings.rank

    @property
    def reference(self) -> str | None:
        return self.plan_settings.reference

    # -- the support -----------------------------------------------------------------------

    def _local(self, values: np.ndarray) -> np.ndarray:
        """``[N]`` values restricted to the support, in its order (``values`` itself for all)."""
        return values if self.support is None else values[self.support]

    def _priorities(self, scores: torch.Tensor) -> np.ndarray:
        """The policy's keep priorities of the support's samples (``[M]``), from their scores only."""
        return self.policy.priorities(self._local(scores.detach().cpu().to(torch.float32).numpy()))

    # -- what kind of epoch ----------------------------------------------------------------

    def holds(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` is held at full data whatever the scores: a sifted epoch at
        the start rule's first opening with scores (nothing to compare them with yet)."""
        return (
            self.config.start_rank_correlation is not None
            and self.kind(epoch) == "sift"
            and epoch <= self._first_scored()
        )

    def _first_scored(self) -> int:
        """The first epoch that opens with scores: epoch 1 (epoch 0 has none)."""
        return 1

    def kind(self, epoch: int) -> str:
        # Epoch 0 has no scores: a warm-up whatever the config, unless a reference table ranks it.
        if epoch < max(0 if self.reference is not None else 1, self.config.warmup_epochs):
            return "warmup"
        if self.num_epochs is not None and epoch >= self.num_epochs - self.config.anneal_epochs(self.num_epochs):
            return "anneal"
        return "sift"

    def sifts(self) -> bool:
        """Whether some epoch of the run is sifted (without ``num_epochs``: every one after the
        warm-up is): only a sifted epoch's length can depend on the scores."""
        if self.num_epochs is None:
            return True
        return any(self.kind(e) == "sift" for e in range(self.num_epochs))

    def needs_scores(self, epoch: int) -> bool:
        """Whether epoch ``epoch``, or a later one, plans from scores: only then is the epoch's
        one host transfer and merge over ranks worth its cost."""
        if epoch < 1:
            return False
        if self.num_epochs is None:
            return True
        return epoch < self.num_epochs - self.config.anneal_epochs(self.num_epochs)

    # -- counts ----------------------------------------------------------------------------

    def _whole(self, k: int) -> int:
        """``k`` made a multiple of the world size (equal shares), at least one per rank."""
        w = self.world_size
        return max(w, (k // w) * w)

    def sifted_left(self, epoch: int | None) -> int | None:
        """Sifted epochs from ``epoch`` to the run's last one, ``epoch`` included (None without
        ``num_epochs`` or an epoch: no planned end)."""
        if self.num_epochs is None or epoch is None:
            return None
        return sum(1 for e in range(epoch, self.num_epochs) if self.kind(e) == "sift")

    def budget_share(self, epoch: int | None = None) -> float:
        """The share budgeted sifted epoch ``epoch`` keeps (``EpochSiftConfig.budget_share``)."""
        share = self.config.budget_share(self.sifted_left(epoch))
        if share is None:
            raise ValueError("budget_count() needs a config with kept_share or max_pruned_share")
        return share

    def budget_count(self, epoch: int | None = None) -> int:
        """Samples of budgeted sifted epoch ``epoch``: ``round(share * M)``, shared equally
        (``kept_share``'s are the same in every epoch; ``max_pruned_share``'s without an epoch
        are of a long run's early epochs)."""
        return self._whole(int(math.floor(self.budget_share(epoch) * self.m + 0.5)))

    def free_count(self, expected: float) -> int:
        """Samples of an unbudgeted sifted epoch: the expected count rounded to whole
        batches on every rank (never more than the support holds)."""
        unit = self.batch_size * self.world_size
        k = int(math.floor(expected / unit + 0.5)) * unit
        if k > self.m:
            k = (self.m // unit) * unit
        if k <= 0:
            k = min(unit, self.m)
        return self._whole(k)

    def rank_batches(self, total: int) -> int:
        """Batches per rank for ``total`` samples over all ranks."""
        per_rank = total // self.world_size
        b = self.batch_size
        return per_rank // b if self.drop_last else -(-per_rank // b)

    def expected_count(self, epoch: int, scores: torch.Tensor | None = None) -> int:
        """Samples that epoch ``epoch`` trains on over all ranks: exact for full and budgeted
        epochs; for an unbudgeted sifted epoch, planned from ``scores`` when given (the
        current table), else from the policy's expected share (``policies.py``: an estimate for
        ``below_mean``)."""
        if self.kind(epoch) != "sift" or self.holds(epoch):
            return self._whole(self.m)
        if self.config.has_budget:
            return self.budget_count(epoch)
        if scores is not None and not bool(np.isnan(self._local(scores.detach().cpu().float().numpy())).all()):
            return self.free_count(float(self._priorities(scores).sum(dtype=np.float64)))
        return self.free_count(self.policy.expected_share() * self.m)

    def epoch_batches(self, epoch: int) -> int:
        """This rank's batches of epoch ``epoch`` before it is planned (exact for full and
        budgeted epochs, the expected count otherwise)."""
        return self.rank_batches(self.expected_count(epoch))

    def steps_left(
        self, next_epoch: int, left_in_current: int = 0, epochs: int | None = None, open_epoch: bool | None = None
    ) -> int:
        """Batches this rank trains from now on: ``left_in_current`` of an epoch in progress
        plus epochs ``next_epoch, ...`` up to ``num_epochs``, or ``epochs`` epochs in all (the
        one in progress counted first). ``open_epoch``: whether an epoch is in progress (None:
        when ``left_in_current > 0``); an open epoch with nothing left (resumed after its last
        batch) is the loop's next, empty iteration, and counts as one of ``epochs``. See
        ``EpochSiftingDataloader.planned_steps``."""
        current = left_in_current > 0 if open_epoch is None else open_epoch
        if epochs is None:
            if self.num_epochs is None:
                raise ValueError("planned_steps() needs num_epochs (given to the loader) or epochs=")
            future = range(next_epoch, self.num_epochs)
        else:
            positive_int(epochs, "epochs")
            future = range(next_epoch, next_epoch + epochs - (1 if current else 0))
        total = left_in_current if current else 0
        for e in future:
            total += self.epoch_batches(e)
        return total
