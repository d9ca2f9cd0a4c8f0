"""The epoch planner: which samples each epoch trains on, in what order, on which rank.

Host-side and deterministic: a plan is a function of (seed, epoch index, the merged
scores at the epoch's start, the guard's streaks), so every data-parallel rank computes
the same global plan and takes its own equal share, and a resumed run re-plans nothing
(the plan in progress is in the checkpoint) while later plans come out the same.

Kinds of epoch: ``warmup`` (the first ``warmup_epochs``), ``anneal`` (the last
``floor(anneal_fraction * num_epochs)``, and any epoch past ``num_epochs``) and ``sift``.
Warm-up and annealing epochs train on every sample with unit weights.

A sifted epoch draws its kept set by systematic sampling over a seeded random order:
with inclusion probabilities ``pi`` summing to an integer ``k``, the points ``u, u+1,
..., u+k-1`` (``u`` uniform in [0, 1)) fall into the cumulative sums of ``pi`` in that
order; the samples hit are kept. Each sample is kept with probability exactly ``pi_i``
(its interval has length ``pi_i <= 1``) and exactly ``k`` are kept, so the weights
``1 / pi`` are exact and the length is known. The kept samples train in the random order.
"""

import math
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from neuron_sift.epoch.host_policy import keep_priorities_np, scale_to_count_np
from neuron_sift.epoch.policy import loss_weights
from neuron_sift.sift_config.epoch_config import EpochSiftConfig

_MASK63 = (1 << 63) - 1


def _epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed per (seed, epoch): splitmix64 of both."""
    x = (seed * 0x9E3779B97F4A7C15 + (epoch + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & ((1 << 64) - 1)
    x ^= x >> 31
    return x & _MASK63


@dataclass
class EpochPlan:
    """One epoch's plan. ``order``: the kept sample ids of all ranks, in training order
    (length a multiple of the world size); ``weights``: ``[N]`` float32 loss weight of each
    sample (``1 / pi`` for sifted epochs, 1 otherwise); ``inclusion``: ``[N]`` float32
    ``pi`` (1 in full epochs)."""

    epoch: int
    kind: str
    order: torch.Tensor
    weights: torch.Tensor
    inclusion: torch.Tensor
    excluded: int = 0  # samples left out by the noise guard

    @property
    def kept(self) -> int:
        return int(self.order.shape[0])


class EpochPlanner:
    """Plans epochs for ``n`` samples, ``world_size`` ranks, ``batch_size`` per rank."""

    def __init__(
        self,
        config: EpochSiftConfig,
        n: int,
        batch_size: int,
        drop_last: bool,
        seed: int,
        num_epochs: Optional[int] = None,
        world_size: int = 1,
        rank: int = 0,
    ):
        if n < world_size:
            raise ValueError(f"the dataset has {n} samples, fewer than the {world_size} ranks")
        self.config = config
        self.n = n
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.num_epochs = num_epochs
        self.world_size = world_size
        self.rank = rank

    # -- what kind of epoch ----------------------------------------------------------------

    def kind(self, epoch: int) -> str:
        if epoch < self.config.warmup_epochs:
            return "warmup"
        if self.num_epochs is not None and epoch >= self.num_epochs - self.config.anneal_epochs(self.num_epochs):
            return "anneal"
        return "sift"

    # -- counts ----------------------------------------------------------------------------

    def _whole(self, k: int) -> int:
        """``k`` made a multiple of the world size (equal shares), at least one per rank."""
        w = self.world_size
        return max(w, (k // w) * w)

    def budget_count(self) -> int:
        """Samples of a budgeted sifted epoch: ``round(kept_share * N)``, shared equally."""
        return self._whole(int(math.floor(self.config.kept_share * self.n + 0.5)))

    def free_count(self, expected: float) -> int:
        """Samples of an unbudgeted sifted epoch: the expected count rounded to whole
        batches on every rank (never more than the dataset holds)."""
        unit = self.batch_size * self.world_size
        k = int(math.floor(expected / unit + 0.5)) * unit
        if k > self.n:
            k = (self.n // unit) * unit
        if k <= 0:
            k = min(unit, self.n)
        return self._whole(k)

    def rank_batches(self, total: int) -> int:
        """Batches per rank for ``total`` samples over all ranks."""
        per_rank = total // self.world_size
        b = self.batch_size
        return per_rank // b if self.drop_last else -(-per_rank // b)

    def expected_count(self, epoch: int, scores: Optional[torch.Tensor] = None) -> int:
        """Samples that epoch ``epoch`` trains on over all ranks: exact for full and budgeted
        epochs; for an unbudgeted sifted epoch, planned from ``scores`` when given (the
        current table), else from the config's expected share (``below_mean`` without
        scores: assumes half the scores below their mean)."""
        if self.kind(epoch) != "sift":
            return self._whole(self.n)
        if self.config.kept_share is not None:
            return self.budget_count()
        if scores is not None and not bool(torch.isnan(scores).all()):
            return self.free_count(float(self._priorities(scores).sum(dtype=np.float64)))
        share = self.config.expected_kept_share()
        if share is None:
            share = 1.0 - 0.5 * self.config.prune_ratio
        return self.free_count(share * self.n)

    # -- planning --------------------------------------------------------------------------

    def _priorities(self, scores: torch.Tensor) -> np.ndarray:
        c = self.config
        values = scores.detach().cpu().to(torch.float32).numpy()
        return keep_priorities_np(values, c.policy, c.beta_value, c.min_keep_probability, c.prune_ratio)

    def plan(self, epoch: int, scores: torch.Tensor, excluded: Optional[torch.Tensor] = None) -> EpochPlan:
        """The plan of epoch ``epoch`` (0-based) from ``scores`` (``[N]`` CPU, NaN = unscored)
        and the guard's ``excluded`` samples (``[N]`` bool, or None)."""
        rng = np.random.Generator(np.random.PCG64(_epoch_seed(self.seed, epoch)))
        perm = rng.permutation(self.n)
        kind = self.kind(epoch)
        values = scores.detach().cpu().to(torch.float32).numpy()
        unscored = np.isnan(values)
        if kind != "sift" or bool(unscored.all()):
            k = self._whole(self.n)
            ones = torch.ones(self.n, dtype=torch.float32)
            return EpochPlan(epoch, kind if kind != "sift" else "sift-unscored", torch.from_numpy(perm[:k].copy()), ones, ones)
        p = self._priorities(scores)
        n_excluded = 0
        if excluded is not None and self.config.noise_guard_epochs > 0:
            out = excluded.cpu().numpy() & ~unscored
            n_excluded = int(out.sum())
            p = np.where(out, np.float32(0.0), p)
        k = self.budget_count() if self.config.kept_share is not None else self.free_count(float(p.sum(dtype=np.float64)))
        k = min(k, self._whole(int((p > 0).sum())))
        pi = scale_to_count_np(p, float(k), unscored)
        order = systematic_sample_np(pi, perm, k, float(rng.random()))
        weights = loss_weights(torch.from_numpy(pi), self.config.max_weight)
        return EpochPlan(epoch, "sift", torch.from_numpy(order), weights, torch.from_numpy(pi.astype(np.float32)), n_excluded)

    def rank_batches_of(self, plan: EpochPlan) -> List[np.ndarray]:
        """This rank's batches of ``plan``: every ``world_size``-th id from ``rank``, cut into
        batches of ``batch_size`` (the last one short unless ``drop_last``)."""
        mine = plan.order[self.rank :: self.world_size].numpy()
        b = self.batch_size
        n = (len(mine) // b) * b if self.drop_last else len(mine)
        return [mine[i : min(i + b, n)] for i in range(0, n, b)]


def systematic_sample_np(pi: np.ndarray, perm: np.ndarray, k: int, u: float) -> np.ndarray:
    """Ids kept by systematic sampling: exactly ``k`` (``sum(pi)`` must be ``k``), each with
    probability ``pi_i``, in the order of ``perm``."""
    edges = np.cumsum(pi[perm])
    total = float(edges[-1]) if edges.size else 0.0
    if abs(total - k) > 1e-6 * max(1.0, k):
        raise AssertionError(f"internal error: inclusion probabilities sum to {total}, not {k}")
    if total > 0:
        edges *= k / total  # exact sum k against rounding
    points = u + np.arange(k, dtype=np.float64)
    hit = np.minimum(np.searchsorted(edges, points, side="right"), perm.shape[0] - 1)
    return perm[hit].astype(np.int64)


def systematic_sample(pi: torch.Tensor, perm: torch.Tensor, k: int, u: float) -> torch.Tensor:
    """``systematic_sample_np`` for tensors."""
    return torch.from_numpy(systematic_sample_np(pi.double().numpy(), perm.numpy(), k, u))
