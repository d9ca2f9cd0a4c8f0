"""What the arms that plan each epoch's subset themselves share (``dynamic-random``, ``seta``):
the ``epoch`` arm's setting they match, the phases of a run, a sampler that trains a
planned subset in the seed's order, and the loop over such a sampler.

Why a sampler and not a filter on the batches: a skipped sample is then never loaded nor
forwarded, which is where the time is saved, as in the ``infobatch`` arm and the
library's ``EpochSiftingDataloader``. The kept samples are trained in the seed's data
order (``ctx.order(epoch)`` filtered), so every arm sees the same order of what it keeps.

Why the phases come from the ``epoch`` arm's config: the brief of these arms is to cost
what ``epoch`` costs, so their full-data warm-up and annealing epochs are the library's
(``EpochSiftConfig``: ``max(1, warmup_epochs)`` first epochs, epoch 0 always, as the
library's planner does; ``floor(anneal_fraction * epochs)`` last ones), not a copy of its
numbers. The setting itself (``EPOCH_ARM_SETTING``) is here, below every arm, and not in
the ``epoch`` arms' plug-in: a plug-in imports no other plug-in.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from benchmarks.core.context import ArmContext
from benchmarks.core.fairness import CosineSchedule
from benchmarks.core.loops import train_weighted_epoch
from neuron_sift import EpochSiftConfig

# The ``epoch`` arm's setting: the best of the sweep on the main job (README, "Epoch-level
# sifting"). ``dynamic-random`` keeps its budget and both peers train its phases.
EPOCH_ARM_SETTING: dict[str, Any] = dict(
    policy="percentile",
    kept_share=0.5,
    beta_value=1.0,
    min_keep_probability=0.05,
    warmup_epochs=1,
    anneal_fraction=0.125,
)


@dataclass(frozen=True)
class Phases:
    """Which epochs of a run of ``epochs`` train on all data first (warm-up), which are
    sifted, and from which epoch on the run anneals."""

    epochs: int
    warmup: int
    anneal_from: int

    @classmethod
    def of(cls, config: EpochSiftConfig, epochs: int) -> "Phases":
        """The library's phases of ``config``: epoch 0 never sifts (it has no scores), and with
        the start rule on neither does epoch 1 (its scores have nothing to compare with yet).
        Further epochs the rule holds depend on the scores: an arm without any pays none."""
        first = 2 if config.start_rank_correlation is not None else 1
        warmup = min(max(first, config.warmup_epochs), epochs)
        return cls(epochs, warmup, max(warmup, epochs - config.anneal_epochs(epochs)))

    def kind(self, epoch: int) -> str:
        if epoch < self.warmup:
            return "warmup"
        if epoch >= self.anneal_from:
            return "anneal"
        return "sift"


def generator(seed: int, salt: int, step: int) -> torch.Generator:
    """A generator of its own per (seed, arm, epoch): an arm's draws do not depend on the
    epochs before, nor on what any other arm drew."""
    return torch.Generator().manual_seed((1_000_003 * seed + 7_919 * salt + step) & ((1 << 63) - 1))


class PlannedSubsetSampler(Sampler[int], ABC):
    """Trains, per epoch, the samples ``choose(epoch, scores)`` keeps, with its weights.

    Subclasses implement ``choose``: a ``[n]`` bool keep mask and ``[n]`` loss weights.
    With ``record_scores`` the loss of every trained sample is recorded as its score (on
    the model's device, without a host read per step; read once per epoch by ``plan``),
    NaN where never scored; non-finite losses are not recorded.
    """

    def __init__(
        self,
        n: int,
        order: Callable[[int], torch.Tensor],
        device: str | torch.device | None = None,
        record_scores: bool = False,
    ):
        self.n = n
        self.order = order
        self.device = torch.device(device or "cpu")
        self.record_scores = record_scores
        self.scores = torch.full((n,), float("nan"), device=self.device)
        self.device_weights = torch.ones(n, device=self.device)
        self.indices = torch.arange(0)
        self.kept_per_epoch: list[int] = []

    @abstractmethod
    def choose(self, epoch: int, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Epoch ``epoch``'s ``[n]`` bool keep mask and ``[n]`` loss weights, from the
        recorded ``scores`` (a CPU copy, NaN where never scored)."""

    def plan(self, epoch: int) -> int:
        """Choose epoch ``epoch``'s samples and weights; returns how many are kept."""
        keep, weights = self.choose(epoch, self.scores.cpu())
        self.device_weights = weights.to(self.device, torch.float32)
        order = self.order(epoch)
        self.indices = order[keep[order]]
        self.kept_per_epoch.append(int(self.indices.numel()))
        return int(self.indices.numel())

    def loss(self, ids: torch.Tensor, per_sample: torch.Tensor) -> torch.Tensor:
        """The batch's loss ``mean(w_i * l_i)`` (the library's ``weighted_loss`` form);
        records the losses as scores first when the sampler keeps scores."""
        ids = ids.to(self.device)
        if self.record_scores:
            losses = per_sample.detach().float()
            self.scores[ids] = torch.where(torch.isfinite(losses), losses, self.scores[ids])
        return (per_sample * self.device_weights[ids]).mean()

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices.tolist())

    def __len__(self) -> int:
        return int(self.indices.numel())


def train_planned(ctx: ArmContext, sampler: PlannedSubsetSampler, sched: CosineSchedule, by_epoch: bool) -> int:
    """Every epoch of the task: plan it, then train its kept samples in batches of the
    task's batch size with the sampler's loss. ``by_epoch``: the schedule is an epoch
    schedule, told each planned epoch's batches. Returns the samples trained."""
    loader = DataLoader(ctx.dataset, batch_size=ctx.task.batch_size, sampler=sampler)
    for epoch in range(ctx.epochs):
        k = sampler.plan(epoch)
        if by_epoch:
            sched.begin_epoch(len(loader))
        train_weighted_epoch(ctx, loader, sched, epoch, k, sampler.loss)
    return sum(sampler.kept_per_epoch)
