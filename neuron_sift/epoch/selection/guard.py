"""The label-noise guard: samples whose loss stays high epoch after epoch are left out.

Why a streak and not one epoch's loss: a hard but learnable sample is high for a while and
then falls; a mislabeled one stays high however long it trains. Counting, per sample, the
epochs in a row in which it was trained and scored at or above the configured quantile
separates the two without any extra forward pass. Sifted epochs then plan without the
samples whose streak reached ``noise_guard_epochs`` (warm-up and annealing epochs still
train on them); see ``EpochSiftConfig``.
"""

import logging
from collections.abc import Callable
from typing import Any

import torch

from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.shared.state_checks import invalid, need_mapping, need_values, need_vector
from neuron_sift.sift_config.epoch_config import EpochSiftConfig

logger = logging.getLogger(EPOCH_LOGGER)


def quantile_of_table(scores: torch.Tensor, q: float) -> float | None:
    """The ``q`` quantile of the recorded ``scores`` (None: none recorded): the whole table's."""
    seen = scores[~torch.isnan(scores)]
    if not seen.numel():
        return None
    return float(torch.quantile(seen.to(torch.float64), q).to(torch.float32))


def guard_would_exclude_all(epoch: int, excluded: int) -> None:
    """The planners' fallback when the guard's streaks cover every sample a rank could keep
    (all scores equal, say: every one is at the quantile): an epoch of nothing cannot be
    planned, so the guard excludes nothing that epoch, and says so."""
    logger.warning(
        "noise guard: the %d samples it would leave out in epoch %d (0-based) are every sample some rank "
        "could keep (scores at or above noise_guard_quantile everywhere); none is left out this epoch",
        excluded,
        epoch,
    )


class NoiseGuard:
    """Per-sample streaks of epochs trained at or above the quantile, one per table entry
    (``n``; a sharded table's are its slots). ``quantile``: the ``q`` quantile of all scores
    from this table (under a sharded table, of every rank's: ``ShardedPlanner.score_quantile``).
    The streaks take memory only while the guard is on."""

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

    @property
    def enabled(self) -> bool:
        return self.config.noise_guard_epochs > 0

    def update(self, scores: torch.Tensor, trained: torch.Tensor | None) -> None:
        """Extend or reset the streaks of the samples ``trained`` in the last epoch (table
        entries, or None before any epoch) from the merged ``scores`` that epoch left."""
        if not self.enabled or trained is None:
            return
        threshold = self.quantile(scores, self.config.noise_guard_quantile)
        if threshold is None:
            return
        was_trained = torch.zeros(self.n, dtype=torch.bool)
        was_trained[trained] = True
        was_trained &= ~torch.isnan(scores)
        high = scores >= threshold
        bumped = torch.where(high, self.streak + 1, torch.zeros_like(self.streak))
        self.streak = torch.where(was_trained, bumped, self.streak)

    def excluded(self) -> torch.Tensor | None:
        """``[N]`` bool, the samples the next sifted plan leaves out; None with the guard off."""
        if not self.enabled:
            return None
        return self.streak >= self.config.noise_guard_epochs

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak.clone()}

    @staticmethod
    def check_state(state: Any, n: int) -> None:
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
        self.check_state(state, self.n)
        streak = state["streak"]
        if self.enabled and streak.numel() == 0:  # a state of a run with the guard off: no streaks yet
            streak = torch.zeros(self.n, dtype=torch.int32)
        self.streak = streak.clone() if self.enabled else torch.zeros(0, dtype=torch.int32)
