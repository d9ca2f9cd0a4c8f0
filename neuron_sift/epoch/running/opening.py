"""Opening an epoch: the one point per epoch where the scores cross to the host.

Why one place: everything an epoch's plan depends on (the merged scores, the noise
guard's streaks, the start rule's decision, the seed) is settled here, in a fixed order, so
every rank computes the same plan and a resumed run re-plans later epochs exactly as the
uninterrupted run did. In order: one host transfer of the score table, one merge over
ranks, the guard's update, the start rule's decision, the reference table's ranking (when
the run has one), the plan, the new weights (one upload
on a device), this rank's share marked.
Epochs that plan without scores (warm-up, annealing) skip the transfer and the merge.
"""

import logging
import time

import numpy as np
import torch

from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.planning.planned_counts import warn_short_epoch
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.running.history import EpochHistory
from neuron_sift.epoch.scores.owned_shares import OwnedShares
from neuron_sift.epoch.scores.rank_shares import RankShares
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.epoch.selection.guard import NoiseGuard
from neuron_sift.epoch.selection.reference_scores import ReferenceScores
from neuron_sift.epoch.selection.start_rule import StartDecision, StartRule
from neuron_sift.shared.logs import EPOCH_LOGGER

logger = logging.getLogger(EPOCH_LOGGER)


class EpochOpener:
    """Plans epoch ``e`` from the parts that hold what the plan depends on."""

    def __init__(
        self,
        planner: EpochPlanner,
        tables: ScoreTables,
        shares: RankShares | OwnedShares,
        guard: NoiseGuard,
        start: StartRule,
        history: EpochHistory,
        reference: ReferenceScores | None = None,
    ) -> None:
        self.reference = reference
        self.planner = planner
        self.tables = tables
        self.shares = shares
        self.guard = guard
        self.start = start
        self.history = history

    def open(self, epoch: int, previous: EpochPlan | None, carried: bool = False) -> tuple[EpochPlan, list[np.ndarray]]:
        """The plan of ``epoch`` and this rank's batches of it; ``previous``: the plan of the
        epoch that just ended (its trained samples update the guard); ``carried``: batches of
        it still wait for their losses (their weights are kept for them)."""
        start = time.perf_counter()
        planner = self.planner
        if planner.num_epochs is not None and epoch == planner.num_epochs:
            logger.warning(
                "EpochSiftingDataloader: epoch %d (0-based) is past num_epochs=%d; it trains on all data",
                epoch,
                planner.num_epochs,
            )
        merged = self.shares.open_scores(self.tables, previous, planner.needs_scores(epoch))
        decision = StartDecision(True, None)
        if merged is not None:
            trained = planner.trained_slots(previous) if previous is not None else None
            self.guard.update(merged, trained)
            decision = self.start.observe(merged, trained, planner.kind(epoch) == "sift")
        scores = merged if merged is not None else torch.full((planner.table_size,), float("nan"))
        sifted = planner.kind(epoch) == "sift"
        ranked = scores if self.reference is None else self.reference.planning_scores(scores)
        plan = planner.plan(epoch, ranked, self.guard.excluded(scores), hold=sifted and not decision.prune)
        if plan.kind == "held":
            logger.info(
                "EpochSiftingDataloader: epoch %d (0-based) trains every sample: the start rule's %s",
                epoch,
                decision.reason(self.start.threshold),
            )
        self.tables.set_weights(plan.weights, epoch, keep_previous=carried)
        batches = planner.rank_batches_of(plan)
        self.shares.planned(batches)
        counts = planner.trained_counts(plan)
        correlation = decision.rank_correlation if sifted else None
        self.history.planned(plan, len(batches), time.perf_counter() - start, counts, correlation)
        warn_short_epoch(planner, plan, counts.kept)
        return plan, batches

    def restore(self, plan: EpochPlan | None, epoch: int) -> None:
        """A checkpoint's plan in progress, of ``epoch`` (0-based): its weights apply again to
        the batches still to come."""
        if plan is not None:
            self.tables.set_weights(plan.weights, epoch)
