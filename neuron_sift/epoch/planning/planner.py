"""The epoch planner: which samples each epoch trains on, in what order, on which rank.

Host-side and deterministic: a plan is a function of (seed, epoch index, the merged
scores at the epoch's start, the guard's streaks), so every data-parallel rank computes
the same global plan and takes its own equal share, and a resumed run re-plans nothing
(the plan in progress is in the checkpoint) while later plans come out the same.

Kinds of epoch: ``warmup`` (the first ``warmup_epochs``, and always epoch 0 without a
reference table: with ``warmup_epochs=0`` it has no scores to plan from yet, so it trains on
every sample and is counted as the warm-up it is; with one it is planned from the reference), ``anneal`` (the last ``floor(anneal_fraction * num_epochs)``,
and any epoch past ``num_epochs``) and ``sift``. Warm-up and annealing epochs train on every
sample with unit weights.

Every plan draws from the *support* only: the samples the user's sampler can yield
(``user_data/sampling.py``). Tables stay indexed by dataset id (``N``); a plan works in the support's
own index space (``M`` samples, all counts from ``M``), percentiles rank the support's
scores among themselves, and its ids map back to dataset ids. Samples outside the support
get inclusion 0 and weight 1: they are never loaded. With ``ordered`` (a sequential
sampler), each epoch's kept samples train in dataset order.

A sifted epoch draws its kept set by systematic sampling (``selection/draws.py``) over a seeded random
order: exactly ``k`` kept, each with probability exactly ``pi_i``; they train in that order.
"""

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.planning.dealing import deal_rest
from neuron_sift.epoch.planning.epoch_counts import EpochCounts
from neuron_sift.epoch.planning.plan import EpochPlan, PlanSettings, TrainedCounts, full_kind
from neuron_sift.epoch.planning.planner_state import check_planner_state
from neuron_sift.epoch.planning.run_identity import RunIdentity
from neuron_sift.epoch.selection.draws import epoch_seed, systematic_sample
from neuron_sift.epoch.selection.guard import guard_would_exclude_all, quantile_of_table
from neuron_sift.epoch.selection.policies import epoch_policy
from neuron_sift.epoch.selection.policy import loss_weights, percentile_of_all, scale_to_count
from neuron_sift.shared.state_checks import invalid, need_distinct


class EpochPlanner(EpochCounts):
    """Plans epochs for ``n`` samples, ``world_size`` ranks, ``batch_size`` per rank, drawing
    only from ``support`` (sorted unique dataset ids; None: all ``n``), in dataset order when
    ``ordered``.

    The one source of every count (``epoch_counts.py``): ``len()``, ``planned_steps()``
    (``steps_left``) and the integrations' schedule lengths all come from here, so they agree
    with the batches the plans yield.
    """

    def __init__(self, settings: PlanSettings) -> None:
        self.plan_settings = settings  # what the registry built it from, read through (``EpochCounts``)
        self.policy = epoch_policy(settings.config)  # the policy's entry: its priorities and expected share
        self.identity = RunIdentity.of(settings)  # what every checkpoint names (the support's checksum once)

    plans_own_share = False  # a plan holds every rank's samples (a sharded table's holds one rank's)

    @property
    def seed(self) -> int:
        """The seed of every plan's order and draws (a checkpoint's, once loaded)."""
        return self.plan_settings.seed

    @seed.setter
    def seed(self, seed: int) -> None:
        self.plan_settings = replace(self.plan_settings, seed=seed)
        self.identity = replace(self.identity, seed=seed)

    def as_rank(self, world_size: int, rank: int) -> "EpochPlanner":
        """This planner as rank ``rank`` of a run at ``world_size`` saw it (the resume at
        another world size reads each old rank's plan with it)."""
        return type(self)(self.plan_settings.as_rank(world_size, rank))

    def trained_ids(self, plan: EpochPlan) -> torch.Tensor:
        """The ids of ``plan`` that some rank actually trains: ``drop_last`` leaves each rank's
        short last batch out, so those samples earned no new score. (The plan's own world
        size decides that cut: a resumed plan keeps the set it was made with.)"""
        world = plan.world_size or self.world_size
        per_rank = len(plan.order) // world
        if self.drop_last:
            per_rank = (per_rank // self.batch_size) * self.batch_size
        return plan.order[: per_rank * world]

    # -- what the tables see ---------------------------------------------------------------

    @property
    def table_size(self) -> int:
        """Entries of this rank's score, weight and streak tables: one per dataset id."""
        return self.n

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """Where the scores of ``ids`` live in this rank's tables: at the ids themselves."""
        return ids

    def entry_ids(self) -> np.ndarray:
        """The ids of the table entries a plan can draw: the sampler's samples."""
        return np.arange(self.n, dtype=np.int64) if self.support is None else self.support

    @property
    def owned_entries(self) -> int:
        """Entries of the tables this rank owns (its noise guard's streaks): every sample."""
        return self.n

    def table_size_for(self, plan: EpochPlan | None) -> int:
        """Entries of this rank's score and weight tables while ``plan`` runs: every sample."""
        return self.table_size

    def check_order(self, order: np.ndarray, field: str, resumed: bool, world: int) -> None:
        """A checkpoint's plan order (``plan_checks.py``): each id once, in equal shares of the
        plan's ``world`` ranks (``resumed``: a plan resumed at another world size)."""
        need_distinct(order, field, self.n)
        if order.shape[0] % world:
            invalid(
                field, f"holds {order.shape[0]} ids, not a multiple of the plan's world size {world} (equal shares)"
            )

    def trained_slots(self, plan: EpochPlan) -> torch.Tensor:
        """The table entries of ``plan``'s trained samples (the noise guard's streaks move there)."""
        return self.trained_ids(plan)

    def trained_counts(self, plan: EpochPlan) -> TrainedCounts:
        """The history's entry of ``plan``: the samples the ranks train of it and their loss
        weights' mean and largest (a replicated plan holds every rank's samples)."""
        trained = self.trained_ids(plan)
        w = plan.weights[trained] if trained.numel() else torch.ones(1)
        return TrainedCounts(int(trained.shape[0]), plan.kept, float(w.mean()), float(w.max()))

    def score_quantile(self, scores: torch.Tensor, q: float) -> float | None:
        """The ``q`` quantile of the finite scores of this table, which holds every sample's
        (the noise guard's threshold), or None when none is finite."""
        return quantile_of_table(scores, q)

    def score_percentiles(self, scores: torch.Tensor) -> np.ndarray:
        """Every entry's mid-rank percentile among all scores (this table holds every
        sample's; the start rule's ranking)."""
        return percentile_of_all(scores.detach().cpu().to(torch.float32).numpy())

    def sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks' tables: every rank holds every sample, so its own."""
        return t

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The run's identity (``run_identity.py``): the seed (every later plan follows from it)
        and what a checkpoint must agree on: another dataset size, support (the samples the
        user's sampler yields), batch size, rank layout, policy or table would make its plan
        and scores mean something else."""
        return self.identity.as_dict()

    def check_state(self, state: dict[str, Any]) -> None:
        """Refuse a state of another rank layout or setup before anything is loaded
        (``planning/planner_state.py``)."""
        check_planner_state(self.identity, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.seed = int(state["seed"])

    # -- planning: one sequence under either table ------------------------------------------

    def plan(
        self, epoch: int, scores: torch.Tensor, excluded: torch.Tensor | None = None, hold: bool = False
    ) -> EpochPlan:
        """The plan of epoch ``epoch`` (0-based) from ``scores`` (this rank's table: ``[N]`` CPU
        here, NaN = unscored), the guard's ``excluded`` entries (bool, or None) and the start
        rule's ``hold`` (a sifted epoch that trains every sample: kind ``held``).

        One sequence under either table: the noise guard's samples left out (unless some rank
        would then keep none), the count, the priorities scaled to it, the draw, the weights.
        What a sharded table's planner does otherwise is in the hooks below (``_``-named):
        which entries it draws from and in what seeded order, priorities from the ranks'
        merged summary, counts over the ranks, its own share of the draw."""
        rng, order = self._seeded_order(epoch)
        kind = self.kind(epoch)
        values = self._local(scores.detach().cpu().to(torch.float32).numpy())
        p = None if kind != "sift" or hold else self._keep_priorities(values)
        if p is None:
            return self._full_plan(epoch, full_kind(kind, hold), order)
        unscored = np.isnan(values)
        left_out, keepable = 0, -1
        if excluded is not None and self.config.noise_guard_epochs > 0:
            out = self._local(excluded.cpu().numpy()) & ~unscored
            guarded = np.where(out, np.float32(0.0), p)
            keepable = self._keepable(int((guarded > 0).sum()))
            if keepable > 0:
                p, left_out = guarded, int(out.sum())
            else:  # the same decision on every rank: they all read the same count
                guard_would_exclude_all(epoch, int(out.sum()))
        if keepable <= 0:
            keepable = self._keepable(int((p > 0).sum()))
        sums = torch.tensor([float(p.sum(dtype=np.float64)), float(left_out)], dtype=torch.float64)
        totals = self.sum_over_ranks(sums)  # the priorities' sum and the samples left out, of every rank
        k = self.budget_count(epoch) if self.config.has_budget else self.free_count(float(totals[0]))
        share = self._share(min(k, self._whole(keepable)))
        pi = scale_to_count(p, float(share), unscored)
        kept = systematic_sample(pi, order, share, float(rng.random()))
        pi = self._global(pi, 0.0)
        weights = loss_weights(torch.from_numpy(pi), self.config.max_weight)
        return self._sifted_plan(epoch, kept, weights, pi, int(totals[1]))

    # -- the hooks: this plan holds every rank's samples -----------------------------------

    def _global(self, local: np.ndarray, fill: float) -> np.ndarray:
        """``[M]`` per-support values placed at their dataset ids, ``fill`` elsewhere."""
        if self.support is None:
            return local
        out = np.full(self.n, fill, dtype=local.dtype)
        out[self.support] = local
        return out

    def _ids(self, local_order: np.ndarray) -> torch.Tensor:
        """Support positions in training order, as dataset ids (sorted when ``ordered``)."""
        ids = local_order if self.support is None else self.support[local_order]
        if self.ordered:
            ids = np.sort(ids)
        return torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))

    def _seeded_order(self, epoch: int) -> tuple[np.random.Generator, np.ndarray]:
        """The epoch's generator and the random order of the support's positions, its first
        draw (the same on every rank)."""
        rng = np.random.Generator(np.random.PCG64(epoch_seed(self.seed, epoch)))
        return rng, rng.permutation(self.m)

    def _keep_priorities(self, values: np.ndarray) -> np.ndarray | None:
        """The policy's keep priorities of the support's samples from their scores ``values``,
        or None when none is scored (the epoch then trains every sample)."""
        if bool(np.isnan(values).all()):
            return None
        return self.policy.priorities(values)

    def _keepable(self, count: int) -> int:
        """The most samples the ranks can keep, ``count`` being this table's with a positive
        priority: this table holds every rank's."""
        return count

    def _share(self, k: int) -> int:
        """The samples this plan draws of the epoch's ``k``: all of them (every rank's)."""
        return k

    def _full_plan(self, epoch: int, kind: str, order: np.ndarray) -> EpochPlan:
        """A plan of kind ``kind`` training every sample, in ``order``: weights and inclusion 1."""
        k = self._whole(self.m)
        ones = torch.ones(self.n, dtype=torch.float32)
        inclusion = torch.from_numpy(self._global(np.ones(self.m, dtype=np.float32), 0.0))
        return EpochPlan(epoch, kind, self._ids(order[:k]), ones, inclusion)

    def _sifted_plan(
        self, epoch: int, kept: np.ndarray, weights: torch.Tensor, pi: np.ndarray, excluded: int
    ) -> EpochPlan:
        """The sifted plan of the ``kept`` positions in training order, with the samples'
        ``weights`` and inclusion probabilities ``pi`` (``[N]``)."""
        return EpochPlan(epoch, "sift", self._ids(kept), weights, torch.from_numpy(pi.astype(np.float32)), excluded)

    def rank_batches_of(self, plan: EpochPlan) -> list[np.ndarray]:
        """This rank's batches of ``plan``: every ``world_size``-th id from ``rank``, cut into
        batches of ``batch_size`` (the last one short unless ``drop_last``). A plan resumed at
        another world size deals out its rest instead: the ids it trains that no rank
        trained before the resume (``dealing.deal_rest``)."""
        if plan.done is not None:
            trained = self.trained_ids(plan).numpy()
            rest = trained[~np.isin(trained, plan.done.numpy())]
            return deal_rest(rest, self.world_size, self.rank, self.batch_size)
        mine = plan.order[self.rank :: self.world_size].numpy()
        b = self.batch_size
        n = (len(mine) // b) * b if self.drop_last else len(mine)
        return [mine[i : min(i + b, n)] for i in range(0, n, b)]
