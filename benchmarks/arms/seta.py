"""The ``seta`` arms: SeTa's rule, random pruning then a sliding window over loss groups.

Source: Zhou, Gao, Wang, "Scale Efficient Training for Large Datasets" (CVPR 2025, arXiv
2503.13385; public code github.com/mrazhou/SeTa). Reimplemented here from the published
rule, no code of theirs. A peer of ``infobatch``: the same free scores, a different way to
spend them (skip the easiest and the hardest samples in turn, no reweighting).

The rule, per epoch ``e`` of a run of ``E`` epochs (phases: ``core.planned.Phases``, the
``epoch`` arm's warm-up and annealing epochs, so the three compare at the same phases):

* warm-up epochs train on every sample (they record the first scores);
* a sample's score is its most recent training loss, recorded from the training forward
  (no scoring forward);
* every sifted epoch, with ``t = e - warm-up epochs`` (``seta_select``): keep a uniform
  random ``round((1 - r) * N)`` of the samples (the random pruning); sort the scored ones
  among them by score and cut them into ``g`` groups of equal size (quantile groups), from
  easy (low loss) to hard; train on the window of ``window_size(g, w)`` consecutive groups
  that starts at group ``t mod (g - size + 1)``: it slides one group per epoch from the
  easy end toward the hard end, and when its last group reaches the hardest one it
  starts again at the easy end (the cyclic window);
* samples of the random share never scored yet are in every window (kept): they earn
  their first score instead of waiting, which happens only after a non-finite loss or
  with no warm-up;
* annealing epochs (the last ``floor(0.125 * E)``, SeTa's partial annealing) train on a
  fresh random ``(1 - r)`` share, no window;
* unit loss weights throughout (SeTa does not reweight), the batch's loss is the mean;
* kept samples are trained in the seed's data order, skipped ones never loaded.

Two choices differ from SeTa's code, and say why:

* groups are equal-size quantiles of the loss, not 1-D k-means clusters: no sklearn
  dependency, and deterministic given the scores (k-means depends on its start); both
  order the groups by loss, quantiles make each group the same share of the kept data;
* the window holds ``floor(w * g)`` groups (never more than the share ``w`` of them):
  ``round`` is ambiguous at SeTa's settings, where ``w * g`` is exactly 4.5 (and 3.5), and
  rounding 4.5 up would make the window all 5 groups, i.e. no curriculum at all.

The arms: ``seta`` is SeTa's lossless setting, r = 0.1, g = 5, w = 0.9 (window of 4
groups: about 0.72 of the data per sifted epoch); ``seta-aggressive`` is r = 0.3, g = 5,
w = 0.7 (window of 3 groups: about 0.42). The learning-rate schedule advances epoch by
epoch over each planned epoch's batches (``ctx.epoch_schedule``), as for ``infobatch``.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from benchmarks.core.context import ArmContext
from benchmarks.core.planned import EPOCH_ARM_SETTING, Phases, PlannedSubsetSampler, generator, train_planned
from neuron_sift import EpochSiftConfig

SALT = 2503  # this arm's draws (arXiv 2503.13385)


class Setting(NamedTuple):
    """SeTa's knobs: the share ``r`` pruned at random, ``g`` loss groups, window share ``w``."""

    r: float
    g: int
    w: float


LOSSLESS = Setting(r=0.1, g=5, w=0.9)
AGGRESSIVE = Setting(r=0.3, g=5, w=0.7)


def window_size(g: int, w: float) -> int:
    """Groups in the window: ``floor(w * g)`` (see the module docstring), at least 1."""
    return min(g, max(1, math.floor(w * g + 1e-9)))


def window_of(step: int, g: int, w: float) -> range:
    """The groups of the ``step``-th sifted epoch's window (0: the first after warm-up)."""
    size = window_size(g, w)
    start = step % (g - size + 1)
    return range(start, start + size)


def random_share(n: int, r: float, seed: int, step: int) -> torch.Tensor:
    """``[n]`` bool: a uniform random ``round((1 - r) * n)`` samples (halves up), drawn
    afresh for every (seed, step)."""
    k = int(math.floor((1.0 - r) * n + 0.5))
    keep = torch.zeros(n, dtype=torch.bool)
    keep[torch.randperm(n, generator=generator(seed, SALT, step))[:k]] = True
    return keep


def quantile_groups(ids: torch.Tensor, scores: torch.Tensor, g: int) -> list[torch.Tensor]:
    """``ids`` sorted by ``scores[ids]`` (ties by id) and cut into ``g`` consecutive groups
    whose sizes differ by at most one: group 0 the lowest losses (easy), group g-1 the highest."""
    ids = torch.sort(ids).values
    ranked = ids[torch.sort(scores[ids], stable=True).indices]
    return list(torch.tensor_split(ranked, g))


def seta_select(scores: torch.Tensor, step: int, seed: int, r: float, g: int, w: float) -> torch.Tensor:
    """The samples SeTa keeps in its ``step``-th sifted epoch: ``[n]`` bool.

    ``scores``: ``[n]``, NaN where never scored. A pure function of its arguments: the
    random share of (seed, step), the quantile groups of its scored samples, the window of
    ``step``; the unscored samples of the share are kept whatever the window.
    """
    n = scores.shape[0]
    share = random_share(n, r, seed, step)
    scored = ~torch.isnan(scores)
    keep = share & ~scored
    groups = quantile_groups(torch.nonzero(share & scored).flatten(), scores, g)
    for j in window_of(step, g, w):
        keep[groups[j]] = True
    return keep


class SeTaSampler(PlannedSubsetSampler):
    """Plans each epoch with ``seta_select`` (sifted), a random share (annealing) or all
    (warm-up); records the training losses as scores."""

    def __init__(
        self,
        n: int,
        order: Callable[[int], torch.Tensor],
        phases: Phases,
        seed: int,
        r: float,
        g: int,
        w: float,
        device: str | torch.device | None = None,
    ):
        super().__init__(n, order, device, record_scores=True)
        if not (0.0 <= r < 1.0 and g >= 1 and 0.0 < w <= 1.0):
            raise ValueError(f"seta needs 0 <= r < 1, g >= 1, 0 < w <= 1; got r={r}, g={g}, w={w}")
        self.phases, self.seed, self.r, self.g, self.w = phases, seed, r, g, w
        self.windows: list[list[int] | None] = []

    def choose(self, epoch: int, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kind = self.phases.kind(epoch)
        step = epoch - self.phases.warmup
        window = None
        if kind == "warmup":
            keep = torch.ones(self.n, dtype=torch.bool)
        elif kind == "anneal":
            keep = random_share(self.n, self.r, self.seed, step)
        else:
            keep = seta_select(scores, step, self.seed, self.r, self.g, self.w)
            window = list(window_of(step, self.g, self.w))
        self.windows.append(window)
        return keep, torch.ones(self.n)


def seta_arm(r: float, g: int, w: float) -> Callable[[ArmContext], dict]:
    def arm(ctx: ArmContext) -> dict:
        # the epoch arm's warm-up and annealing, not the library's start rule: SeTa's own rule has none
        phases = Phases.of(EpochSiftConfig(**{**EPOCH_ARM_SETTING, "start_rank_correlation": None}), ctx.epochs)
        sampler = SeTaSampler(len(ctx.dataset), ctx.order, phases, ctx.seed, r, g, w, ctx.device)
        trained = train_planned(ctx, sampler, ctx.epoch_schedule(ctx.epochs), by_epoch=True)
        return {
            "samples_kept": trained,
            "scoring_forward_samples": 0,
            "kept_per_epoch": sampler.kept_per_epoch,
            "windows": sampler.windows,
            "seta": {"r": r, "g": g, "w": w, "window_size": window_size(g, w)},
        }

    arm.__doc__ = f"SeTa (Zhou et al., CVPR 2025), r={r}, g={g}, w={w}; see the module docstring."
    return arm


def register_arms(register: Callable[..., Callable]) -> None:
    """``seta`` (a default arm) and ``seta-aggressive``."""
    register(
        "seta",
        seta_arm(*LOSSLESS),
        default=True,
        description="SeTa's rule (Zhou et al., CVPR 2025): random 0.9 share, a window of 4 of 5 loss groups "
        "sliding easy to hard, partial annealing (r=0.1, g=5, w=0.9)",
    )
    register(
        "seta-aggressive",
        seta_arm(*AGGRESSIVE),
        description="SeTa's rule, r=0.3, g=5, w=0.7: random 0.7 share, a window of 3 of 5 loss groups",
    )
