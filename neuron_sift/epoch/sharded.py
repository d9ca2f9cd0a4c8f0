"""Planning under a sharded score table (``EpochSiftConfig(score_table="sharded")``).

Why each rank trains the samples it owns: then a loss is recorded where its score lives,
in the rank's own table, and no score ever crosses ranks; the alternative (train anywhere,
send each loss to its owner once per epoch) is an all-to-all of every trained sample's
loss per epoch, as large as the epoch. What crosses ranks per sifted epoch instead is
fixed: the gather of each rank's score summary (``quantiles.summarize_over_ranks``:
``(knots + 2) * 16`` bytes per rank), one all-reduce of two float64 and one of one int64,
and for the history's entry (weights of all ranks, ``trained_counts``) one all-gather of two
float64 per rank.

How an epoch is drawn (stratified systematic sampling, one stratum per rank): every rank
reads its samples' percentiles off the merged summary, hence the policy's keep priority
``p_i`` of each; the kept count ``k`` of the epoch is the same as the replicated planner's
(the budget ``round(kept_share * M)``, or ``sum(p)`` over all ranks rounded to whole
batches), and each rank keeps exactly ``k / W`` of its own samples: inclusion
probabilities ``pi_i = min(1, c_r * p_i)`` summing to ``k / W`` over its stratum, drawn by
systematic sampling over a permutation seeded by (seed, epoch, rank). Each sample is kept
with probability exactly ``pi_i`` and weighted ``1 / pi_i``, so the epoch's weighted loss
is unbiased as in the replicated planner (only the marginals enter), the count is exact
and every rank runs the same number of batches. ``p_i`` is a pure function of (score,
merged summary); ``c_r`` and the draw depend on the owner's stratum, so the decisions of a
rank's samples are recomputed from that rank's shard, the seed and the summary.

What a rank holds: its scores (4 bytes per owned sample), the epoch's weights (4) and its
kept ids in training order (int32 below 2**31 samples: at most 4), the noise guard's
streaks only when it is on; nothing of size ``N``.

What differs from the replicated table: percentiles within the summary's rank error (0
where each rank has at most ``knots`` distinct scores), a sample trains on the same rank
in every epoch (batches mix the ranks' strata each step, as the gradients are averaged),
and the plan's order is a different draw than the replicated planner's.
"""

from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.dealing import deal_rest
from neuron_sift.epoch.draws import epoch_seed, systematic_sample
from neuron_sift.epoch.history import TrainedCounts
from neuron_sift.epoch.ownership import Ownership
from neuron_sift.epoch.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.policy import keep_priorities, loss_weights, scale_to_count
from neuron_sift.epoch.quantiles import KNOTS, ScoreSummary, quantile_value, summarize_over_ranks
from neuron_sift.epoch.tables import ScoreTables
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.state_checks import invalid, need_mapping

CHUNK = 1 << 20  # samples per pass of the priorities: their temporaries stay a few MB


class ShardedPlanner(EpochPlanner):
    """The planner of one rank's share: the same counts, kinds and settings as
    ``EpochPlanner``; plans, batches and tables of this rank's owned samples only."""

    def __init__(self, *args: Any, ranks: RankGroup, knots: int = KNOTS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranks = ranks
        self.knots = knots
        self.owner = Ownership(self.n, self.support, self.world_size, self.rank)
        self.id_dtype = np.int32 if self.n <= np.iinfo(np.int32).max else np.int64
        self.last_summary: ScoreSummary | None = None  # of the last sifted epoch: its rank error

    # -- the tables ------------------------------------------------------------------------

    @property
    def table_size(self) -> int:
        return self.owner.size

    def slots(self, ids: np.ndarray) -> np.ndarray:
        return self.owner.slots(ids)

    def score_quantile(self, scores: torch.Tensor, q: float) -> float | None:
        """The ``q`` quantile of every rank's scores, from their merged summary (one gather)."""
        summary = summarize_over_ranks(scores.detach().cpu().to(torch.float32).numpy(), self.ranks, self.knots)
        return quantile_value(summary, q)

    def trained_ids(self, plan: EpochPlan) -> torch.Tensor:
        """This rank's trained ids of its plan (``drop_last`` cuts its short last batch); of a
        plan resumed at another world size, the ids dealt to this rank."""
        if plan.done is not None:
            batches = self.rank_batches_of(plan)
            return torch.from_numpy(np.concatenate(batches) if batches else np.empty(0, dtype=np.int64))
        n = int(plan.order.shape[0])
        if self.drop_last:
            n = (n // self.batch_size) * self.batch_size
        return plan.order[:n].to(torch.int64)

    def trained_slots(self, plan: EpochPlan) -> torch.Tensor:
        """The slots of the samples this rank owns that ``plan`` trained (the noise guard's
        streaks move there): its own trained samples; of a plan resumed at another world
        size, every owned sample the epoch trained on any rank, before the resume or after
        (its ``order`` lists them all), wherever it trained (hosted guests are their owners'
        to count, after ``hand_over``)."""
        ids = plan.order.numpy().astype(np.int64) if plan.done is not None else self.trained_ids(plan).numpy()
        return torch.from_numpy(self.owner.slots(ids[self.owner.owners(ids) == self.rank]))

    def host_guests(self, plan: EpochPlan | None) -> None:
        """Host the guests of ``plan`` (a checkpoint's plan in progress) after the owned slots."""
        self.owner.adopt(self.guests_of(plan))

    def guests_of(self, plan: EpochPlan | None) -> np.ndarray:
        """The samples of ``plan`` this rank trains but does not own (only in a plan resumed
        at another world size, whose rest is dealt out whatever the owners)."""
        if plan is None or plan.done is None:
            return np.empty(0, dtype=np.int64)
        ids = self.trained_ids(plan).numpy()
        return ids[self.owner.owners(ids) != self.rank]

    def hand_over(self, tables: ScoreTables) -> None:
        """At the end of an epoch resumed at another world size: every hosted guest's score
        goes to its owner (one all-reduce of one int64, one all-gather of ``16 * G`` bytes
        per rank, ``G`` the most guests any rank hosts), and the table shrinks to the owned
        slots. Every rank calls it at the same point (the end of a resumed epoch)."""
        guests, own = self.owner.guests, self.owner.owned
        scores = tables.snapshot()
        mine = scores[:own].clone()
        most = -self.ranks.min_int(-int(guests.shape[0]))
        if most:
            rows = torch.full((most, 2), -1.0, dtype=torch.float64)
            rows[: guests.shape[0], 0] = torch.from_numpy(guests.astype(np.float64))
            rows[: guests.shape[0], 1] = scores[own:].to(torch.float64)
            gathered = self.ranks.all_gather_rows(rows).numpy()
            ids, values = gathered[:, 0].astype(np.int64), gathered[:, 1].astype(np.float32)
            keep = (ids >= 0) & ~np.isnan(values)
            ids, values = ids[keep], values[keep]
            here = self.owner.owners(ids) == self.rank
            mine[torch.from_numpy(self.owner.slots(ids[here]))] = torch.from_numpy(values[here])
        nonfinite = tables.nonfinite()
        self.owner.adopt(np.empty(0, dtype=np.int64))
        tables.resize(self.owner.size)
        tables.load_scores(mine)
        tables.set_nonfinite(nonfinite)

    def trained_weights(self, plan: EpochPlan) -> tuple[int, torch.Tensor]:
        """Every rank trains as many samples as this one; the weights are this rank's (the
        history's entry takes ``trained_counts``, of all ranks)."""
        slots = self.trained_slots(plan)
        return int(slots.shape[0]) * self.world_size, plan.weights[slots]

    def trained_counts(self, plan: EpochPlan) -> TrainedCounts:
        """The history's entry of this rank's fresh ``plan`` over all ranks, as a replicated
        plan reports it: every rank draws and trains as many samples as this one (equal
        shares), and the weights' mean and largest are of every rank's trained samples (one
        all-gather of two float64 per rank, in a sifted epoch only: the others weigh every
        sample 1). Every rank calls it when it opens the epoch."""
        slots = self.trained_slots(plan)
        kept, planned = int(slots.shape[0]) * self.world_size, plan.kept * self.world_size
        if plan.kind != "sift":
            return TrainedCounts(kept, planned, 1.0, 1.0)
        w = plan.weights[slots].to(torch.float64)
        most = float(w.max()) if w.numel() else 1.0
        rows = self.ranks.all_gather_rows(torch.tensor([[float(w.sum()), most]], dtype=torch.float64))
        mean = float(rows[:, 0].sum()) / kept if kept else 1.0
        return TrainedCounts(kept, planned, mean, float(rows[:, 1].max()))

    def rank_batches_of(self, plan: EpochPlan) -> list[np.ndarray]:
        """This rank's plan cut into batches (the last one short unless ``drop_last``). A plan
        resumed at another world size holds every old rank's trained ids and those done
        (``reowning.py``): its rest is dealt out as the replicated planner deals it."""
        if plan.done is not None:
            order = plan.order.numpy().astype(np.int64)
            return deal_rest(order[~np.isin(order, plan.done.numpy())], self.world_size, self.rank, self.batch_size)
        mine = plan.order.numpy()  # views of the plan (int32 ids below 2**31 samples): no copy per epoch
        b = self.batch_size
        n = (len(mine) // b) * b if self.drop_last else len(mine)
        return [mine[i : min(i + b, n)] for i in range(0, n, b)]

    def expected_count(self, epoch: int, scores: torch.Tensor | None = None) -> int:
        """As ``EpochPlanner.expected_count`` without scores: a count from this rank's share
        alone would differ between ranks, and ``len()`` must not start a collective."""
        return super().expected_count(epoch, None)

    # -- planning --------------------------------------------------------------------------

    def _order(self, slots: np.ndarray) -> torch.Tensor:
        ids = self.owner.ids()[slots]
        if self.ordered:
            ids = np.sort(ids)
        return torch.from_numpy(np.ascontiguousarray(ids, dtype=self.id_dtype))

    def plan(self, epoch: int, scores: torch.Tensor, excluded: torch.Tensor | None = None) -> EpochPlan:
        """This rank's plan of epoch ``epoch`` from its own ``scores`` (``[owned]``, by slot,
        NaN = unscored) and the guard's ``excluded`` slots. A sifted epoch joins three
        collectives (every rank plans every epoch, so they meet)."""
        rng = np.random.Generator(np.random.PCG64(epoch_seed(epoch_seed(self.seed, epoch), self.rank)))
        own, w = self.owner.owned, self.world_size
        kind = self.kind(epoch)
        values = scores.detach().cpu().to(torch.float32).numpy()
        summary = summarize_over_ranks(values, self.ranks, self.knots) if kind == "sift" else None
        if summary is None or summary.count == 0:
            per_rank = self._whole(self.m) // w
            perm = rng.permutation(own)[:per_rank]
            ones = torch.ones(own, dtype=torch.float32)
            return EpochPlan(epoch, kind if kind != "sift" else "sift-unscored", self._order(perm), ones, None)
        self.last_summary = summary
        c = self.config
        p = np.empty(own, dtype=np.float32)
        for at in range(0, own, CHUNK):  # elementwise given the summary: in chunks, a bounded transient
            part = slice(at, at + CHUNK)
            p[part] = keep_priorities(
                values[part], c.policy, c.beta_value, c.min_keep_probability, c.prune_ratio, summary
            )
        unscored = np.isnan(values)
        mine_excluded = 0
        if excluded is not None and c.noise_guard_epochs > 0:
            out = excluded.cpu().numpy() & ~unscored
            mine_excluded = int(out.sum())
            p = np.where(out, np.float32(0.0), p)
        totals = self.ranks.sum(
            torch.tensor([float(p.sum(dtype=np.float64)), float(mine_excluded)], dtype=torch.float64)
        )
        eligible = self.ranks.min_int(int((p > 0).sum()))  # the fewest any rank can keep
        k = self.budget_count() if c.kept_share is not None else self.free_count(float(totals[0]))
        k = min(k, self._whole(eligible * w))
        pi = scale_to_count(p, float(k // w), unscored)
        kept = systematic_sample(pi, rng.permutation(own), k // w, float(rng.random()))
        weights = loss_weights(torch.from_numpy(pi), c.max_weight)
        return EpochPlan(epoch, "sift", self._order(kept), weights, None, int(totals[1]))


class OwnedShares:
    """``RankShares`` of a sharded table: nothing to merge, every rank already holds the fresh
    scores of the samples it owns (it trained them), so the tables are left as they are."""

    active = False

    def planned(self, batches: list[np.ndarray]) -> None:
        pass

    def carried_over(self, ids: np.ndarray) -> None:
        pass

    def merge(self, scores: torch.Tensor) -> torch.Tensor:
        return scores

    def state_dict(self) -> dict[str, Any]:
        return {}

    @staticmethod
    def check_state(state: Any, n: int) -> None:
        """Refuse anything but the empty state (a sharded table keeps no marks; ``n`` unused)."""
        if need_mapping(state, "shares"):
            invalid("shares", f"must be empty under a sharded score table, got keys {sorted(map(str, state))}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state, 0)
