"""The label-noise guard: samples whose loss stays high epoch after epoch are left out.

Why a streak and not one epoch's loss: a hard but learnable sample is high for a while and
then falls; a mislabeled one stays high however long it trains. Counting, per sample, the
epochs in a row in which it was trained and scored at or above the configured quantile
separates the two without any extra forward pass. Sifted epochs then plan without the
samples whose streak reached ``noise_guard_epochs`` (warm-up and annealing epochs still
train on them); see ``EpochSiftConfig``.
"""

from typing import Any

import torch

from neuron_sift.sift_config.epoch_config import EpochSiftConfig


class NoiseGuard:
    """Per-sample streaks of epochs trained at or above the quantile."""

    def __init__(self, config: EpochSiftConfig, n: int) -> None:
        self.config = config
        self.n = n
        self.streak = torch.zeros(n, dtype=torch.int32)

    @property
    def enabled(self) -> bool:
        return self.config.noise_guard_epochs > 0

    def update(self, scores: torch.Tensor, trained: torch.Tensor | None) -> None:
        """Extend or reset the streaks of the samples ``trained`` in the last epoch (ids, or
        None before any epoch) from the merged ``scores`` that epoch left."""
        if not self.enabled or trained is None:
            return
        seen = ~torch.isnan(scores)
        if not bool(seen.any()):
            return
        was_trained = torch.zeros(self.n, dtype=torch.bool)
        was_trained[trained] = True
        was_trained &= seen
        threshold = torch.quantile(scores[seen].to(torch.float64), self.config.noise_guard_quantile).to(torch.float32)
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = state["streak"].clone()
