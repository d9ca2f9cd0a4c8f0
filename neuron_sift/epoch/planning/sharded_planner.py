"""The planner of a sharded score table (``EpochSiftConfig(score_table="sharded")``): each rank
plans the samples it owns.

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

import numpy as np
import torch

from neuron_sift.epoch.planning.dealing import deal_rest
from neuron_sift.epoch.planning.ownership import Ownership
from neuron_sift.epoch.planning.plan import EpochPlan, PlanSettings, TrainedCounts
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.selection.draws import epoch_seed
from neuron_sift.epoch.selection.quantiles import (
    KNOTS,
    ScoreSummary,
    percentiles,
    quantile_value,
    summarize_over_ranks,
)
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.state_checks import invalid, need_distinct

CHUNK = 1 << 20  # samples per pass of the priorities: their temporaries stay a few MB


class ShardedPlanner(EpochPlanner):
    """The planner of one rank's share: the same counts, kinds, settings and planning sequence
    as ``EpochPlanner`` (its ``plan``, through the hooks below); plans, batches and tables of
    this rank's owned samples only."""

    def __init__(self, settings: PlanSettings, ranks: RankGroup, knots: int = KNOTS) -> None:
        super().__init__(settings)
        self.ranks = ranks
        self.knots = knots
        self.owner = Ownership(self.n, self.support, self.world_size, self.rank)
        self.id_dtype = np.int32 if self.n <= np.iinfo(np.int32).max else np.int64
        self.last_summary: ScoreSummary | None = None  # of the last sifted epoch: its rank error

    plans_own_share = True

    def as_rank(self, world_size: int, rank: int) -> "ShardedPlanner":
        """This planner as rank ``rank`` of a run at ``world_size`` saw it: that rank's
        ownership (no guests; the resume adds them from the rank's plan)."""
        return ShardedPlanner(self.plan_settings.as_rank(world_size, rank), self.ranks, self.knots)

    # -- the tables ------------------------------------------------------------------------

    @property
    def table_size(self) -> int:
        return self.owner.size

    def slots(self, ids: np.ndarray) -> np.ndarray:
        return self.owner.slots(ids)

    def entry_ids(self) -> np.ndarray:
        """The ids of this rank's own table entries, in slot order."""
        return self.owner.ids()

    @property
    def owned_entries(self) -> int:
        """Entries of the tables this rank owns (its noise guard's streaks): its share."""
        return self.owner.owned

    def table_size_for(self, plan: EpochPlan | None) -> int:
        """Entries while ``plan`` runs: the owned samples, then the guests of a plan resumed at
        another world size."""
        return self.owner.owned + int(self.guests_of(plan).shape[0])

    def check_order(self, order: np.ndarray, field: str, resumed: bool, world: int) -> None:
        """A checkpoint's plan order: this rank's own samples, each once (a resumed plan's holds
        every old rank's trained ids, each once)."""
        if resumed:
            need_distinct(order, field, self.n)
            return
        owners = self.owner.owners(order)
        foreign = owners != self.rank
        if foreign.any():
            at = int(np.flatnonzero(foreign)[0])
            invalid(
                field,
                f"holds sample id {int(order[at])}, owned by rank {int(owners[at])}, not by this rank "
                f"({self.rank} of {self.world_size}): a sharded rank's plan holds its own samples",
            )
        need_distinct(self.owner.slots(order), field, self.owner.owned)

    def score_quantile(self, scores: torch.Tensor, q: float) -> float | None:
        """The ``q`` quantile of every rank's scores, from their merged summary (one gather)."""
        summary = summarize_over_ranks(scores.detach().cpu().to(torch.float32).numpy(), self.ranks, self.knots)
        return quantile_value(summary, q)

    def score_percentiles(self, scores: torch.Tensor) -> np.ndarray:
        """Each owned entry's percentile among every rank's scores, read off their merged
        summary (one gather; within its rank error)."""
        values = scores.detach().cpu().to(torch.float32).numpy()
        return percentiles(summarize_over_ranks(values, self.ranks, self.knots), values)

    def sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks: each holds the samples it owns (one all-reduce)."""
        return self.ranks.sum(t)

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
        to count, after the hand-over: ``OwnedShares.open_scores``)."""
        ids = plan.order.numpy().astype(np.int64) if plan.done is not None else self.trained_ids(plan).numpy()
        return torch.from_numpy(self.owner.slots(ids[self.owner.owners(ids) == self.rank]))

    def guests_of(self, plan: EpochPlan | None) -> np.ndarray:
        """The samples of ``plan`` this rank trains but does not own (only in a plan resumed
        at another world size, whose rest is dealt out whatever the owners)."""
        if plan is None or plan.done is None:
            return np.empty(0, dtype=np.int64)
        ids = self.trained_ids(plan).numpy()
        return ids[self.owner.owners(ids) != self.rank]

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
        (``resuming/sharded_reshard.py``): its rest is dealt out as the replicated planner deals it."""
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

    # -- the plan's hooks (``EpochPlanner.plan``): this plan holds this rank's samples --------

    def _local(self, values: np.ndarray) -> np.ndarray:
        """This rank's table holds only the entries its plans draw from (its owned samples)."""
        return values

    def _global(self, local: np.ndarray, fill: float) -> np.ndarray:
        """Per-entry values are already this rank's table's."""
        return local

    def _ids(self, local_order: np.ndarray) -> torch.Tensor:
        """Slots in training order, as dataset ids (sorted when ``ordered``; int32 below 2**31)."""
        ids = self.owner.ids()[local_order]
        if self.ordered:
            ids = np.sort(ids)
        return torch.from_numpy(np.ascontiguousarray(ids, dtype=self.id_dtype))

    def _seeded_order(self, epoch: int) -> tuple[np.random.Generator, np.ndarray]:
        """The epoch's generator of this rank (seeded by the seed, the epoch and the rank) and
        the random order of its owned slots, its first draw."""
        rng = np.random.Generator(np.random.PCG64(epoch_seed(epoch_seed(self.seed, epoch), self.rank)))
        return rng, rng.permutation(self.owner.owned)

    def _keep_priorities(self, values: np.ndarray) -> np.ndarray | None:
        """The priorities of this rank's own ``values`` (by slot, NaN = unscored), read off every
        rank's merged summary (one gather), or None when no rank has a score. A sifted epoch that
        prunes joins this collective and those of ``_keepable`` and ``sum_over_ranks`` (every
        rank plans every epoch, so they meet)."""
        summary = summarize_over_ranks(values, self.ranks, self.knots)
        if summary.count == 0:
            return None
        self.last_summary = summary
        own = self.owner.owned
        p = np.empty(own, dtype=np.float32)
        for at in range(0, own, CHUNK):  # elementwise given the summary: in chunks, a bounded transient
            part = slice(at, at + CHUNK)
            p[part] = self.policy.priorities(values[part], summary)
        return p

    def _keepable(self, count: int) -> int:
        """The most samples the ranks can keep in equal shares: the fewest any rank can (its
        ``count`` with a positive priority; one all-reduce), on every rank."""
        return self.ranks.min_int(count) * self.world_size

    def _share(self, k: int) -> int:
        """This rank's equal share of the epoch's ``k``."""
        return k // self.world_size

    def _full_plan(self, epoch: int, kind: str, order: np.ndarray) -> EpochPlan:
        """A plan of kind ``kind`` training this rank's share of every sample: unit weights."""
        per_rank = self._whole(self.m) // self.world_size
        ones = torch.ones(self.owner.owned, dtype=torch.float32)
        return EpochPlan(epoch, kind, self._ids(order[:per_rank]), ones, None)

    def _sifted_plan(
        self, epoch: int, kept: np.ndarray, weights: torch.Tensor, pi: np.ndarray, excluded: int
    ) -> EpochPlan:
        """The sifted plan of the ``kept`` slots, weighted ``1 / pi`` by slot (no inclusion)."""
        return EpochPlan(epoch, "sift", self._ids(kept), weights, None, excluded)
