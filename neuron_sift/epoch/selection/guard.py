"""The label-noise guard: samples whose loss stays high epoch after epoch are left out.

Why a streak and not one epoch's loss: a hard but learnable sample is high for a while and
then falls; a mislabeled one stays high however long it trains. Counting, per sample, the
epochs in a row in which it was trained and scored above the configured quantile separates
the two without any extra forward pass. Sifted epochs then plan without the samples whose
streak reached ``noise_guard_epochs`` (warm-up and annealing epochs still train on them);
see ``EpochSiftConfig``.

Why "above", strictly, and above the quantile of this epoch's scores: a trained classifier
has many float32 losses of exactly 0.0, and where more than ``1 - q`` of the scores tie at
the ``q`` quantile, counting a tie as high made every learned sample "high" and left most
clean samples out. So the threshold is the lowest score with at least a ``q`` share of the
scores at or below it, a tie with it is not above it, and a sample is left out only while
its score is above the threshold of the epoch being planned: at most ``1 - q`` of the scored
samples are left out in any epoch (within the rank error of a sharded table's summary, 0
where each rank has at most its ``knots`` distinct scores), however the streaks accumulate.
"""

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.shared.state_checks import invalid, need_mapping, need_values, need_vector
from neuron_sift.sift_config.epoch_config import EpochSiftConfig

logger = logging.getLogger(EPOCH_LOGGER)


def quantile_of_table(scores: torch.Tensor, q: float) -> float | None:
    """The lowest recorded score with at least a ``q`` share of the recorded ``scores`` at or
    below it (None: none recorded; unscored entries, NaN, are left out): the whole table's.
    So fewer than ``1 - q`` of them are above it, whatever ties there are."""
    seen = scores[~torch.isnan(scores)]
    m = int(seen.numel())
    if not m:
        return None
    k = min(m, max(1, math.ceil(q * m - 1e-9)))  # the k-th smallest: at least q * m at or below it
    return float(torch.kthvalue(seen.to(torch.float32).cpu(), k).values)


def guard_would_exclude_all(epoch: int, excluded: int) -> None:
    """The planners' fallback when the samples the guard leaves out are every sample some rank
    could keep (a sharded table's rank whose own samples are all above the quantile): an
    epoch of nothing cannot be planned, so the guard excludes nothing that epoch, and says so."""
    logger.warning(
        "noise guard: the %d samples it would leave out in epoch %d (0-based) are every sample some rank "
        "could keep (scores above noise_guard_quantile everywhere on that rank); none is left out this epoch",
        excluded,
        epoch,
    )


class NoiseGuard:
    """Per-sample streaks of epochs trained above the quantile, one per table entry (``n``; a
    sharded table's are its slots). ``quantile``: the ``q`` quantile of all scores from this
    table (under a sharded table, of every rank's: ``ShardedPlanner.score_quantile``), the
    lowest score with at least a ``q`` share at or below it. The streaks take memory only while
    the guard is on; ``threshold`` is the quantile of the scores the last update saw."""

    def __init__(
        self,
        config: EpochSiftConfig,
        n: int,
        quantile: Callable[[torch.Tensor, float], float | None] = quantile_of_table,
    ) -> None:
        self.config = config
        self.n = n
        self.quantile = quantile
        self.streak = torch.zeros(n if self.enabled else 0, dtype=torch.int32)
        self.threshold: float | None = None

    @property
    def enabled(self) -> bool:
        return self.config.noise_guard_epochs > 0

    def update(self, scores: torch.Tensor, trained: torch.Tensor | None) -> None:
        """Extend or reset the streaks of the samples ``trained`` in the last epoch (table
        entries, or None before any epoch) from the merged ``scores`` that epoch left; the
        threshold of those scores is kept for ``excluded``. Every rank calls it at the same
        points (a sharded table's quantile is a collective)."""
        if not self.enabled:
            return
        self.threshold = self.quantile(scores, self.config.noise_guard_quantile)
        if trained is None or self.threshold is None:
            return
        was_trained = torch.zeros(self.n, dtype=torch.bool)
        was_trained[trained] = True
        was_trained &= ~torch.isnan(scores)
        high = scores > self.threshold  # a tie with the threshold (many exact 0.0 losses) is not above it
        bumped = torch.where(high, self.streak + 1, torch.zeros_like(self.streak))
        self.streak = torch.where(was_trained, bumped, self.streak)

    def excluded(self, scores: torch.Tensor | None = None) -> torch.Tensor | None:
        """``[N]`` bool, the samples the next sifted plan leaves out: a streak of
        ``noise_guard_epochs`` and, given the ``scores`` the plan is made from, a score above
        the last update's threshold (so at most ``1 - q`` of the scored samples); None with the
        guard off."""
        if not self.enabled:
            return None
        out = self.streak >= self.config.noise_guard_epochs
        if scores is None:
            return out
        if self.threshold is None:
            return torch.zeros_like(out)
        return out & (scores > self.threshold)

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak.clone()}

    def check_state(self, state: Any) -> None:
        """Refuse a state that is not streaks of this rank's ``n`` table entries (or none)."""
        self.check_sized(state, self.n)

    @staticmethod
    def check_sized(state: Any, n: int) -> None:
        """Refuse a state that is not a streak per table entry (``n``; none: the guard was off)."""
        need_mapping(state, "guard", ("streak",))
        streak = need_vector(state["streak"], "guard.streak", torch.int32)
        if streak.shape[0] not in (0, n):
            invalid(
                "guard.streak",
                f"must hold {n} entries (one per entry of this rank's table) or none, got {streak.shape[0]}",
            )
        need_values(streak, "guard.streak", 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        streak = state["streak"]
        if self.enabled and streak.numel() == 0:  # a state of a run with the guard off: no streaks yet
            streak = torch.zeros(self.n, dtype=torch.int32)
        self.streak = streak.clone() if self.enabled else torch.zeros(0, dtype=torch.int32)
