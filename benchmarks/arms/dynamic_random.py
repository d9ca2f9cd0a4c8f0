"""The ``dynamic-random`` arm: a new uniform random subset every epoch, at the ``epoch`` arm's cost.

Source: Raju, Daruwalla, Lipasti, "Accelerating Deep Learning with Dynamic Data Pruning"
(arXiv 2111.12621), whose uniform baseline draws a new random subset of the data every
epoch; reimplemented here from that rule, no code of theirs. It is the control the
loss-based ``epoch`` arm has to beat: the same number of samples and optimizer steps per
epoch, chosen without looking at any loss. If ``epoch`` does no better, its ranking of the
samples bought nothing.

The rule, everything sized by the ``epoch`` arm's own config (``core.planned.EPOCH_ARM_SETTING``, read
through the library's ``EpochSiftConfig``) so the two cannot drift apart:

* warm-up and annealing epochs (``core.planned.Phases``: the library's) train on every sample,
  unit weights;
* every other epoch keeps a uniform random subset of exactly ``k = round(kept_share * N)``
  samples, the count the ``epoch`` arm's budget keeps, drawn afresh from a generator of
  (run seed, epoch), so each sample is kept with probability ``p = k / N``;
* a kept sample's loss is weighted ``1 / p`` and the batch's loss is ``mean(w_i * l_i)``
  (the library's ``weighted_loss`` form), so the expected loss of an epoch is the
  full-data loss, as for the ``epoch`` arm;
* the kept samples are trained in the seed's data order (``ctx.order(epoch)`` filtered);
* no scores, no scoring forward.

The learning-rate schedule is sized by the library's plan of the ``epoch`` arm's loader
(``EpochSiftingDataloader.planned_steps()`` over the same dataset, batch size and epochs,
never iterated), and the arm checks that its own batch count equals it: same steps, same
schedule, by construction rather than by a count of its own.

Why not the library's loader with a uniform policy: ``EpochSiftConfig`` offers
``percentile`` and ``below_mean`` only; a uniform draw could be faked (equal scores, or a
vanishing ``beta_value``), but that would test the fake, not the rule.
"""

import math
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader

from benchmarks.core.context import ArmContext
from benchmarks.core.planned import EPOCH_ARM_SETTING, Phases, PlannedSubsetSampler, generator, train_planned
from neuron_sift import EpochSiftConfig, EpochSiftingDataloader

SALT = 2111  # this arm's draws (arXiv 2111.12621)


def kept_count(kept_share: float, n: int) -> int:
    """Samples of a sifted epoch: ``round(kept_share * n)``, halves up, as the library's budget."""
    return max(1, int(math.floor(kept_share * n + 0.5)))


class DynamicRandomSampler(PlannedSubsetSampler):
    """Per sifted epoch a fresh uniform random ``k`` of the ``n`` samples, weight ``n / k``."""

    def __init__(
        self,
        n: int,
        order: Callable[[int], torch.Tensor],
        phases: Phases,
        kept_share: float,
        seed: int,
        device: str | torch.device | None = None,
    ):
        super().__init__(n, order, device, record_scores=False)
        self.phases = phases
        self.k = kept_count(kept_share, n)
        self.p = self.k / n
        self.seed = seed

    def choose(self, epoch: int, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.phases.kind(epoch) != "sift":
            return torch.ones(self.n, dtype=torch.bool), torch.ones(self.n)
        keep = torch.zeros(self.n, dtype=torch.bool)
        keep[torch.randperm(self.n, generator=generator(self.seed, SALT, epoch))[: self.k]] = True
        return keep, torch.where(keep, torch.full((self.n,), 1.0 / self.p), torch.ones(self.n))

    def planned_steps(self, batch_size: int) -> int:
        """The batches of the whole run (no short batch is dropped)."""
        per_epoch = [self.k if self.phases.kind(e) == "sift" else self.n for e in range(self.phases.epochs)]
        return sum(-(-k // batch_size) for k in per_epoch)


def epoch_arm_plan(ctx: ArmContext, config: EpochSiftConfig) -> int:
    """The ``epoch`` arm's planned steps, from the library: its loader over the same data,
    batch size and epochs, planned but never iterated."""
    source = DataLoader(ctx.dataset, batch_size=ctx.task.batch_size, shuffle=True)
    return EpochSiftingDataloader(config, source, num_epochs=ctx.epochs).planned_steps()


def dynamic_random(ctx: ArmContext) -> dict:
    config = EpochSiftConfig(seed=ctx.seed, **EPOCH_ARM_SETTING)
    if config.kept_share is None:
        raise ValueError("dynamic-random matches the epoch arm's budget: EPOCH_ARM_SETTING needs a kept_share")
    phases = Phases.of(config, ctx.epochs)
    sampler = DynamicRandomSampler(len(ctx.dataset), ctx.order, phases, config.kept_share, ctx.seed, ctx.device)
    planned = epoch_arm_plan(ctx, config)
    own = sampler.planned_steps(ctx.task.batch_size)
    if own != planned:
        raise RuntimeError(f"dynamic-random plans {own} steps, the epoch arm {planned}: they must cost the same")
    trained = train_planned(ctx, sampler, ctx.step_schedule(planned), by_epoch=False)
    return {
        "samples_kept": trained,
        "scoring_forward_samples": 0,
        "kept_per_epoch": sampler.kept_per_epoch,
        "keep_probability": round(sampler.p, 6),
        "epoch_config": dict(EPOCH_ARM_SETTING),
    }


def register_arms(register: Callable[..., Callable]) -> None:
    """``dynamic-random``, a default arm."""
    register(
        "dynamic-random",
        dynamic_random,
        default=True,
        description="a new uniform random subset every epoch, the epoch arm's kept share and phases, "
        "weight 1/p (Raju et al., arXiv 2111.12621)",
    )
