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
from neuron_sift.epoch.selection.draws import epoch_seed, systematic_sample
from neuron_sift.epoch.selection.guard import guard_would_exclude_all, quantile_of_table
from neuron_sift.epoch.selection.policies import epoch_policy
from neuron_sift.epoch.selection.policy import loss_weights, percentile_of_all, scale_to_count
from neuron_sift.epoch.user_data.sampling import support_checksum
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
        self.plan_settings = settings  # what the registry built it from (a rank of another world: ``as_rank``)
        self.config = settings.config
        self.policy = epoch_policy(settings.config)  # the policy's entry: its priorities and expected share
        self.n = settings.n
        self.support = settings.support
        self.m = settings.n if settings.support is None else int(settings.support.shape[0])  # every count is of these
        self.ordered = settings.ordered
        self.support_crc32 = support_checksum(settings.support)  # computed once: every checkpoint names it
        self.batch_size = settings.batch_size
        self.drop_last = settings.drop_last
        self.seed = settings.seed
        self.num_epochs = settings.num_epochs
        self.world_size = settings.world_size
        self.rank = settings.rank
        self.reference = settings.reference

    plans_own_share = False  # a plan holds every rank's samples (a sharded table's holds one rank's)

    def as_rank(self, world_size: int, rank: int) -> "EpochPlanner":
        """This planner as rank ``rank`` of a run at ``world_size`` saw it (the resume at
        another world size reads each old rank's plan with it)."""
        return type(self)(replace(self.plan_settings, world_size=world_size, rank=rank, seed=self.seed))

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

    def settings(self) -> dict[str, Any]:
        """What a checkpoint must agree on: another dataset size, support (the samples the
        user's sampler yields), batch size, rank layout or policy would make its plan and
        scores mean something else. The support is named only when it is not the whole
        dataset, so states of runs over all samples (and older states) keep their layout."""
        settings: dict[str, Any] = {
            "n": self.n,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "rank": self.rank,
            "policy": self.config.policy,
            "kept_share": self.config.kept_share,
            "max_pruned_share": self.config.max_pruned_share,  # states without it had none
            "reference": self.reference,  # the reference table's identity; states without it had none
        }
        if self.support is not None:
            settings["support_size"] = self.m
            settings["support_crc32"] = self.support_crc32
        return settings

    def state_dict(self) -> dict[str, Any]:
        """The seed (every later plan follows from it) and the settings it is only valid with."""
        return {"seed": self.seed, **self.settings()}

    def check_state(self, state: dict[str, Any]) -> None:
        """Refuse a state of another rank layout or setup before anything is loaded
        (``planning/planner_state.py``)."""
        check_planner_state(self, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.seed = int(state["seed"])

    # -- planning --------------------------------------------------------------------------

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

    def plan(
        self, epoch: int, scores: torch.Tensor, excluded: torch.Tensor | None = None, hold: bool = False
    ) -> EpochPlan:
        """The plan of epoch ``epoch`` (0-based) from ``scores`` (``[N]`` CPU, NaN = unscored),
        the guard's ``excluded`` samples (``[N]`` bool, or None) and the start rule's ``hold``
        (a sifted epoch that trains every sample: kind ``held``)."""
        rng = np.random.Generator(np.random.PCG64(epoch_seed(self.seed, epoch)))
        perm = rng.permutation(self.m)  # positions in the support
        kind = self.kind(epoch)
        values = self._local(scores.detach().cpu().to(torch.float32).numpy())
        unscored = np.isnan(values)
        if kind != "sift" or bool(unscored.all()) or hold:
            k = self._whole(self.m)
            ones = torch.ones(self.n, dtype=torch.float32)
            inclusion = torch.from_numpy(self._global(np.ones(self.m, dtype=np.float32), 0.0))
            return EpochPlan(epoch, full_kind(kind, hold), self._ids(perm[:k]), ones, inclusion)
        p = self._priorities(scores)
        n_excluded = 0
        if excluded is not None and self.config.noise_guard_epochs > 0:
            out = self._local(excluded.cpu().numpy()) & ~unscored
            guarded = np.where(out, np.float32(0.0), p)
            if (guarded > 0).any():
                p, n_excluded = guarded, int(out.sum())
            else:
                guard_would_exclude_all(epoch, int(out.sum()))
        k = self.budget_count(epoch) if self.config.has_budget else self.free_count(float(p.sum(dtype=np.float64)))
        k = min(k, self._whole(int((p > 0).sum())))
        pi = self._global(scale_to_count(p, float(k), unscored), 0.0)
        local_order = systematic_sample(self._local(pi), perm, k, float(rng.random()))
        weights = loss_weights(torch.from_numpy(pi), self.config.max_weight)
        return EpochPlan(
            epoch, "sift", self._ids(local_order), weights, torch.from_numpy(pi.astype(np.float32)), n_excluded
        )

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
