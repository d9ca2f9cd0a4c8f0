"""Each rank's share of the scores, and their one merge per epoch.

Why: under data parallelism every rank trains a disjoint share of each epoch's plan, so
each rank's table holds fresh scores only for its own samples. Before a plan is made from
scores, the ranks combine their tables so that all of them plan from the same merged
scores and therefore compute the same global plan. ``RankShares`` remembers which samples
this rank trained since the last merge; ``merge_over_ranks`` is the merge itself.
"""

from typing import Any

import numpy as np
import torch

from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.state_checks import need_mapping, need_vector


class RankShares:
    """The samples this rank trained since the last merge (``mine``) and the samples of the
    epoch before whose losses arrived after it (``carried``: a wrapper prefetching across
    epochs)."""

    def __init__(self, n: int, ranks: RankGroup) -> None:
        self.ranks = ranks
        self.mine = torch.zeros(n, dtype=torch.bool)
        self.carried = torch.zeros(n, dtype=torch.bool)

    def planned(self, batches: list[np.ndarray]) -> None:
        """This rank's batches of the epoch just planned: their scores are this rank's to share."""
        if batches:
            self.mine[torch.from_numpy(np.concatenate(batches))] = True

    def carried_over(self, ids: np.ndarray) -> None:
        """Losses of a batch of the epoch before, recorded after the merge that ended it."""
        self.carried[torch.from_numpy(ids)] = True

    def open_scores(self, tables: ScoreTables, previous: EpochPlan | None, needs_scores: bool) -> torch.Tensor | None:
        """The merged scores the epoch plans from, also written back to this rank's table
        under data parallelism; None when the epoch plans without scores (the marks are kept
        for the next merge). ``previous`` is not needed: every sample's score lives here."""
        if not needs_scores:
            return None
        merged = self.merge(tables.snapshot())
        if self.ranks.active:
            tables.load_scores(merged)
        return merged

    def merge(self, scores: torch.Tensor) -> torch.Tensor:
        """The scores every rank plans from (this rank's own without data parallelism); the
        marks start over for the next epoch."""
        merged = merge_over_ranks(scores, self.mine, self.ranks, self.carried)
        self.mine.zero_()
        self.carried.zero_()
        return merged

    def state_dict(self) -> dict[str, Any]:
        return {"mine": self.mine.clone(), "carried": self.carried.clone()}

    def check_state(self, state: Any) -> None:
        """Refuse a state that is not two marks per sample of this rank's dataset."""
        self.check_sized(state, self.mine.shape[0])

    @staticmethod
    def check_sized(state: Any, n: int) -> None:
        """Refuse a state that is not two marks per sample (``n``)."""
        need_mapping(state, "shares", ("mine", "carried"))
        for key in ("mine", "carried"):
            need_vector(state[key], f"shares.{key}", torch.bool, n, "sample")

    def load_state_dict(self, state: dict[str, Any], plan: EpochPlan | None = None) -> None:
        """The marks; ``plan`` (the checkpoint's plan in progress) needs nothing here, where
        the table holds every sample."""
        self.check_state(state)
        self.mine = state["mine"].clone()
        self.carried = state["carried"].clone()


def merge_over_ranks(
    scores: torch.Tensor, mine: torch.Tensor, ranks: RankGroup, carried: torch.Tensor | None = None
) -> torch.Tensor:
    """Every rank's scores for the samples it trained on since the last merge, combined.

    ``scores``: this rank's ``[N]`` table (CPU); ``mine``: ``[N]`` bool, the samples of this
    rank's share of the last epoch (each sample belongs to one rank per epoch);
    ``carried``: samples of the epoch before whose losses arrived after the last merge; a
    value of the last epoch wins over a carried one (it is newer). One all-reduce of a
    ``[4, N]`` float32 tensor (values and flags): a fixed shape, so every rank joins the
    same collective whatever it trained; entries no rank scored keep the value every rank
    already shares.
    """
    if not ranks.active:
        return scores
    if carried is None:
        carried = torch.zeros_like(mine)
    return combine(ranks.sum(contribution(scores, mine, carried)), scores)


def contribution(scores: torch.Tensor, mine: torch.Tensor, carried: torch.Tensor) -> torch.Tensor:
    """One rank's ``[4, N]`` part of the merge: its fresh values and their flags, then its
    carried values and their flags (summed over ranks by the merge, or by a reshard)."""
    seen = ~torch.isnan(scores)
    a, b = mine & seen, carried & ~mine & seen
    zero = torch.zeros_like(scores)
    return torch.stack(
        [torch.where(a, scores, zero), a.to(torch.float32), torch.where(b, scores, zero), b.to(torch.float32)]
    )


def combine(summed: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The merged table from the ranks' summed contributions: a fresh value wins, carried
    values are averaged, and entries no rank scored keep ``scores`` (every rank shares them)."""
    return torch.where(summed[1] > 0, summed[0], torch.where(summed[3] > 0, summed[2] / summed[3].clamp(min=1), scores))
