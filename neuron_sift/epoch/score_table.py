"""The registry of score-table kinds (``replicated``, ``sharded``), the one seam where
``EpochSiftConfig.score_table`` is read: each kind registered by name with what it is built
from and how it resumes. A kind is a layout, not a table: the tables themselves, this rank's
score and weight tensors, are ``scores/tables.py``'s ``ScoreTables``, one class under either
kind, sized by the planner the kind builds.

Why a registry: a table decides the planner (every sample's scores on every rank, or each
rank planning the samples it owns), how the ranks share fresh scores, where the noise
guard's quantile comes from (the planner's ``score_quantile``), and how states of another
world size become this rank's. Choosing them in one place keeps the loader, the resume path
and the benchmarks from branching on the name (MosaicML Streaming registers its
partitioning and shuffling algorithms the same way).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from neuron_sift.epoch.resuming.replicated_reshard import reshard
from neuron_sift.epoch.resuming.run_states import Resume
from neuron_sift.epoch.resuming.sharded_reshard import reown
from neuron_sift.epoch.resuming.state_layout import SharesCheck
from neuron_sift.epoch.scores.owned_shares import OwnedShares
from neuron_sift.epoch.scores.rank_shares import RankShares
from neuron_sift.shared.ranks import RankGroup

Shares = RankShares | OwnedShares


@dataclass(frozen=True)
class ScoreTableParts:
    """What a loader holds of its score table: the planner and the shares."""

    planner: EpochPlanner
    shares: Shares


@dataclass(frozen=True)
class ScoreTable:
    """One score table: ``build`` makes its parts from the run's settings and ranks,
    ``check_shares`` refuses a bad shares state, ``resume`` makes every old rank's states
    (read and checked) into this rank's at another world size."""

    name: str
    build: Callable[[PlanSettings, RankGroup], ScoreTableParts]
    check_shares: SharesCheck
    resume: Resume


def _replicated(settings: PlanSettings, ranks: RankGroup) -> ScoreTableParts:
    return ScoreTableParts(EpochPlanner(settings), RankShares(settings.n, ranks))


def _sharded(settings: PlanSettings, ranks: RankGroup) -> ScoreTableParts:
    planner = ShardedPlanner(settings, ranks)
    return ScoreTableParts(planner, OwnedShares(planner))


def _reown(read: list[dict[str, Any]], planner: EpochPlanner) -> dict[str, Any]:
    return reown(read, cast(ShardedPlanner, planner))  # the sharded table's loader holds a ShardedPlanner


SCORE_TABLE_REGISTRY: dict[str, ScoreTable] = {
    "replicated": ScoreTable("replicated", _replicated, RankShares.check_sized, reshard),
    "sharded": ScoreTable("sharded", _sharded, OwnedShares.check_sized, _reown),
}


def score_table(name: str) -> ScoreTable:
    """The table registered as ``name`` (``EpochSiftConfig`` validates it: a ``KeyError``
    here is an internal error naming the registered ones)."""
    try:
        return SCORE_TABLE_REGISTRY[name]
    except KeyError:
        raise KeyError(f"no score table {name!r}; registered: {sorted(SCORE_TABLE_REGISTRY)}") from None
