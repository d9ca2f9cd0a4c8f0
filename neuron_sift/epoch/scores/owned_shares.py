"""What a rank of a sharded score table shares with the others: only the scores of samples
it hosted for an epoch resumed at another world size.

Why nothing else: each rank trains the samples it owns, so its table already holds their
fresh scores and there is nothing to merge at an epoch's start. The one exception is the
epoch a run resumes at another world size: its rest is dealt out whatever the owners
(``resuming/sharded_reshard.py``), so a rank hosts those samples (guests) for that epoch
and hands their scores to their owners when it ends.
"""

from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.shared.state_checks import invalid, need_mapping


class OwnedShares:
    """The shares of ``planner``'s rank under a sharded table (the same calls as
    ``RankShares``): its state is empty, its guests follow from the plan in progress."""

    def __init__(self, planner: ShardedPlanner) -> None:
        self.planner = planner

    def planned(self, batches: list[np.ndarray]) -> None:
        """The rank's batches need no mark: it owns every sample it plans."""

    def carried_over(self, ids: np.ndarray) -> None:
        """A late batch of the epoch before is the rank's own: its scores are in place."""

    def open_scores(self, tables: ScoreTables, previous: EpochPlan | None, needs_scores: bool) -> torch.Tensor | None:
        """The scores the epoch plans from (this rank's own, by slot; None when it plans
        without scores). After an epoch resumed at another world size (``previous.done``),
        first hands the guests' scores to their owners: every rank calls it at the same
        point, as the hand-over is collective."""
        if previous is not None and previous.done is not None:
            self._hand_over(tables)
        return tables.snapshot() if needs_scores else None

    def _hand_over(self, tables: ScoreTables) -> None:
        """Every hosted guest's score goes to its owner (one all-reduce of one int64, one
        all-gather of ``16 * G`` bytes per rank, ``G`` the most guests any rank hosts), and
        the table shrinks to the owned slots."""
        planner = self.planner
        owner, ranks = planner.owner, planner.ranks
        guests, own = owner.guests, owner.owned
        scores = tables.snapshot()
        mine = scores[:own].clone()
        most = -ranks.min_int(-int(guests.shape[0]))
        if most:
            rows = torch.full((most, 2), -1.0, dtype=torch.float64)
            rows[: guests.shape[0], 0] = torch.from_numpy(guests.astype(np.float64))
            rows[: guests.shape[0], 1] = scores[own:].to(torch.float64)
            gathered = ranks.all_gather_rows(rows).numpy()
            ids, values = gathered[:, 0].astype(np.int64), gathered[:, 1].astype(np.float32)
            keep = (ids >= 0) & ~np.isnan(values)
            ids, values = ids[keep], values[keep]
            here = owner.owners(ids) == planner.rank
            mine[torch.from_numpy(owner.slots(ids[here]))] = torch.from_numpy(values[here])
        nonfinite = tables.nonfinite()
        owner.adopt(np.empty(0, dtype=np.int64))
        tables.resize(owner.size)
        tables.load_scores(mine)
        tables.set_nonfinite(nonfinite)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def check_state(self, state: Any) -> None:
        """Refuse anything but the empty state."""
        self.check_sized(state, 0)

    @staticmethod
    def check_sized(state: Any, n: int) -> None:
        """Refuse anything but the empty state (a sharded table keeps no marks; ``n`` unused)."""
        if need_mapping(state, "shares"):
            invalid("shares", f"must be empty under a sharded score table, got keys {sorted(map(str, state))}")

    def load_state_dict(self, state: dict[str, Any], plan: EpochPlan | None = None) -> None:
        """The empty state; the guests of ``plan`` (a checkpoint's plan in progress) are
        hosted after the owned slots, so the tables can be sized for them."""
        self.check_state(state)
        self.planner.owner.adopt(self.planner.guests_of(plan))
