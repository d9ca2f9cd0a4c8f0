"""The engine object: owns the device state and turns per-sample losses into selections."""

import logging
from dataclasses import dataclass
from typing import List, Optional

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.engine.state import SiftState
from neuron_sift.engine.step import StepOutput, sift_step
from neuron_sift.exceptions import SiftConfigValidationException
from neuron_sift.sift_config.sift_configs import RelativeProbabilisticSiftConfig

_MAX_SEED = 2**31 - 1


@dataclass
class Selection:
    """Which rows of a source batch were kept, as host ints in source order."""

    indices: List[int]
    step: StepOutput


class Sifter:
    """Runs ``sift_step`` per source batch and keeps the ``SiftState`` on the device."""

    def __init__(self, config: RelativeProbabilisticSiftConfig, backend: Backend):
        self.config = config
        self.backend = backend
        self.mode = config.selection_mode
        seed = config.seed if config.seed is not None else torch.initial_seed()
        self.state = SiftState.create(config.loss_history_length, int(seed) % _MAX_SEED, backend.device)
        self._beta = backend.scalar(config.beta_value, torch.float32)

    def fixed_keep_count(self, batch_size: int) -> int:
        k = self.config.fixed_keep_count(batch_size)
        if k < 1:
            raise SiftConfigValidationException(
                f"RelativeProbabilisticSiftConfig.beta_value: selection_mode='fixed' keeps round(B / (1 + beta)) "
                f"= round({batch_size} / {1 + self.config.beta_value:g}) = 0 samples of each batch of "
                f"{batch_size}; use a larger batch size or a smaller beta_value"
            )
        return k

    def select(self, losses: torch.Tensor, batch_size: int) -> Selection:
        """Select rows of one source batch given its ``[n]`` losses (n may be < batch_size)."""
        n = int(losses.shape[0])
        rows = max(batch_size, n)
        if n < rows:  # pad to the static size; padding rows are masked out on the device
            losses = torch.cat([losses, losses.new_zeros(rows - n)])
        k = self.fixed_keep_count(rows) if self.mode == "fixed" else 1
        n_take = min(self.config.fixed_keep_count(n), k) if self.mode == "fixed" else 0
        self.state, out = sift_step(
            self.state,
            losses,
            self.backend.scalar(n, torch.int64),
            self._beta,
            self.mode,
            k,
            self.backend.scalar(n_take, torch.int64),
        )
        self.backend.after_step()
        if self.mode == "probabilistic":
            keep = self.backend.to_host(out.keep)[:n]
            indices = torch.arange(n)[keep].tolist()
        else:
            indices = self.backend.to_host(out.indices)[:n_take].tolist()
        return Selection(indices=indices, step=out)
