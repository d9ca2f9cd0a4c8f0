"""The ``infobatch`` arm: a reimplementation of the rule published in InfoBatch (Qin et al.,
"InfoBatch: Lossless Training Speed Up by Unbiased Dynamic Data Pruning", ICLR 2024),
written here from the paper, as a peer reference. It is not InfoBatch's code (the public
code patches ``DataLoader`` globally and, with torch 2.9, never ended an epoch).

The rule:

* the score of a sample is its most recent training loss (recorded from the training
  forward: no scoring forward); samples never scored are kept;
* at the start of every epoch, each sample whose score is below the mean of the recorded
  scores is pruned at random with probability ``r = 0.5``; the surviving ones among them
  get loss weight ``1 / (1 - r)``, every other kept sample weight 1;
* the last 12.5% of the epochs (epochs ``e >= 0.875 * epochs``) train on all data with
  unit weights (annealing);
* pruned samples are skipped by the sampler, before they are loaded; the kept ones are
  trained in the seed's data order (``ctx.order(epoch)`` filtered), in batches of the
  task's batch size;
* the loss of a batch is the weighted mean of its per-sample losses,
  ``mean(w_i * loss_i)`` over the batch (so the expected gradient of an epoch is that of
  the full data);
* the learning-rate schedule decays over the arm's own steps: each epoch's length is
  known when it is planned, and the cosine schedule advances by ``1 / (epochs x that
  epoch's batches)`` per step, ending at 0 after the last epoch (``ctx.epoch_schedule``).
"""

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from benchmarks.core.context import ArmContext
from benchmarks.core.loops import train_weighted_epoch

PRUNE_RATIO = 0.5
ANNEAL = 0.125


class InfoBatchSampler(Sampler):
    """Plans each epoch's kept samples from the recorded scores; iterates them in order."""

    def __init__(
        self,
        n: int,
        epochs: int,
        order: Callable[[int], torch.Tensor],
        seed: int,
        prune_ratio: float = PRUNE_RATIO,
        anneal: float = ANNEAL,
        device: str | torch.device | None = None,
    ):
        self.n = n
        self.epochs = epochs
        self.order = order
        self.prune_ratio = prune_ratio
        self.anneal_from = (1.0 - anneal) * epochs  # epochs e >= this train on all data
        self.g = torch.Generator().manual_seed(seed + 4242)
        self.device = torch.device(device or "cpu")
        # the scores live on the model's device (recorded without a host read); read once per epoch
        self.scores = torch.full((n,), float("nan"), device=self.device)  # nan: never scored
        self.weights = torch.ones(n)
        self.device_weights = self.weights.to(self.device)
        self.indices = torch.arange(0)
        self.kept_per_epoch: list[int] = []

    def plan(self, epoch: int) -> int:
        """Choose epoch ``epoch``'s samples and weights; returns how many are kept."""
        keep = torch.ones(self.n, dtype=torch.bool)
        self.weights = torch.ones(self.n)
        scores = self.scores.cpu()
        scored = ~torch.isnan(scores)
        if epoch < self.anneal_from and bool(scored.any()):
            well_learned = scored & (scores < scores[scored].mean())
            pruned = well_learned & (torch.rand(self.n, generator=self.g) < self.prune_ratio)
            keep &= ~pruned
            self.weights[well_learned & keep] = 1.0 / (1.0 - self.prune_ratio)
        self.device_weights = self.weights.to(self.device)
        order = self.order(epoch)
        self.indices = order[keep[order]]
        self.kept_per_epoch.append(int(self.indices.numel()))
        return int(self.indices.numel())

    def record(self, ids: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """Records the batch's losses as its scores; returns the batch's weights (on the losses' device)."""
        ids = ids.to(self.device)
        self.scores[ids] = losses.detach().float()
        return self.device_weights[ids]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices.tolist())

    def __len__(self) -> int:
        return int(self.indices.numel())


def infobatch_arm(ctx: ArmContext) -> dict:
    """InfoBatch's published rule (see the module docstring), r = 0.5, annealing 12.5%."""
    sampler = InfoBatchSampler(len(ctx.dataset), ctx.epochs, ctx.order, ctx.seed, device=ctx.device)
    loader = DataLoader(ctx.dataset, batch_size=ctx.task.batch_size, sampler=sampler)

    def weighted(ids: torch.Tensor, per_sample: torch.Tensor) -> torch.Tensor:
        return (per_sample * sampler.record(ids, per_sample)).mean()  # records the scores, weighs

    sched = ctx.epoch_schedule(ctx.epochs)
    kept = 0
    for epoch in range(ctx.epochs):
        k = sampler.plan(epoch)
        kept += k
        sched.begin_epoch(len(loader))  # the planned epoch's batches
        train_weighted_epoch(ctx, loader, sched, epoch, k, weighted)
    return {
        "samples_kept": kept,
        "scoring_forward_samples": 0,
        "kept_per_epoch": sampler.kept_per_epoch,
        "prune_ratio": PRUNE_RATIO,
        "anneal": ANNEAL,
    }


def register_arms(register: Callable[..., Callable]) -> None:
    """``infobatch``, a default arm."""
    register(
        "infobatch",
        infobatch_arm,
        default=True,
        description="a reimplementation of InfoBatch's published rule (Qin et al., ICLR 2024)",
    )
