"""The start rule: a sifted epoch prunes only when the scores carry information.

Why: a score is a sample's loss of the last time it trained, and a plan trusts it to say
which samples the coming epoch needs. Early in a run, and on a transformer's loss plateau,
it does not: the losses rank how well each sample fits the model of the moment (a partial
solution, or chance), and that ranking reshuffles from one epoch to the next. A plan drawn
from it prunes at random at best, and what an epoch leaves out before the model has left the
plateau is what it loses (the suite's ``bert`` task, trained from scratch: the epoch-level
default pruning from the second epoch ended 30 points below full data). So before each
sifted epoch the rule measures whether the ranking predicts itself one epoch ahead: the
Spearman rank correlation between the percentiles of the samples the last epoch trained at
its opening and at this one (their scores before and after it), over the samples scored at
both. Pruning starts at the first sifted epoch where it is at least
``start_rank_correlation``; until then every sifted epoch trains every sample (kind
``held``). The first opening with scores has nothing to compare with, so that epoch always
trains every sample: pruning starts at the third epoch at the earliest.

Why a start, not a test of every epoch: once pruning has started, the correlation is
measured over the samples the pruned epochs kept, and where most losses are nearly equal
(a trained classifier's float32 losses of exactly 0.0) it swings around any threshold
from one epoch to the next; a run that pruned and held by turns would train neither as
planned. The correlation is still measured and recorded for every sifted epoch.

Decided per epoch from the merged scores at the opening, the same on every rank: a sharded
table's percentiles come from the merged summary of every rank's scores (within its rank
error) and the correlation's sums are added over the ranks, every rank calling ``observe``
at the same openings. The percentiles of the last opening travel in the checkpoint (per
table entry, like the noise guard's streaks), so a resumed run decides as the uninterrupted
one did.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from neuron_sift.shared.state_checks import invalid, need_bool, need_mapping, need_values, need_vector
from neuron_sift.sift_config.epoch_config import EpochSiftConfig


@dataclass(frozen=True)
class StartDecision:
    """Whether a sifted epoch prunes, and why: the measured ``rank_correlation`` (None: not
    measured, the rule is off or there was nothing to compare)."""

    prune: bool
    rank_correlation: float | None

    def reason(self, threshold: float | None) -> str:
        """Why a held epoch trains every sample."""
        if self.rank_correlation is None:
            return "no earlier scores to compare: the ranking is not yet measured"
        return f"rank correlation {self.rank_correlation:.3f} < start_rank_correlation={threshold:g}"


def pearson(sums: torch.Tensor) -> float | None:
    """The correlation from ``[count, sum x, sum y, sum xx, sum yy, sum xy]`` (float64); None
    with fewer than two pairs or a constant side."""
    count, sx, sy, sxx, syy, sxy = (float(v) for v in sums)
    if count < 2:
        return None
    vx, vy = sxx - sx * sx / count, syy - sy * sy / count
    if vx <= 0.0 or vy <= 0.0:
        return None
    return max(-1.0, min(1.0, (sxy - sx * sy / count) / math.sqrt(vx * vy)))


class StartRule:
    """The percentiles of the last scored opening, one per table entry this rank owns (``n``),
    whether pruning has started (``started``), and the decision of each sifted epoch. ``percentiles``: every entry's percentile among
    all ranks' scores (NaN where unscored); ``total``: a tensor summed over the ranks (the
    identity where every rank holds every sample)."""

    def __init__(
        self,
        config: EpochSiftConfig,
        n: int,
        percentiles: Callable[[torch.Tensor], np.ndarray],
        total: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.threshold = config.start_rank_correlation
        self.n = n
        self.percentiles = percentiles
        self.total = total
        self.previous = np.full(n if self.enabled else 0, np.nan, dtype=np.float32)
        self.started = False

    @property
    def enabled(self) -> bool:
        return self.threshold is not None

    def observe(self, scores: torch.Tensor, trained: torch.Tensor | None, sifted: bool) -> StartDecision:
        """At an opening that plans from ``scores`` (every rank at once): the decision for the
        epoch opening now (``sifted``: a sifted epoch, the only kind it decides), from the
        entries ``trained`` in the last epoch (None before any); this opening's percentiles
        are kept for the next one."""
        if not self.enabled:
            return StartDecision(True, None)
        now = self.percentiles(scores).astype(np.float32)
        now[np.isnan(scores.numpy())] = np.nan
        pairs = torch.zeros(6, dtype=torch.float64)
        if trained is not None and trained.numel():
            at = trained.numpy()
            x, y = self.previous[at].astype(np.float64), now[at].astype(np.float64)
            both = ~(np.isnan(x) | np.isnan(y))
            x, y = x[both], y[both]
            pairs = torch.tensor(
                [x.size, x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum()], dtype=torch.float64
            )
        rho = pearson(self.total(pairs))
        self.previous = now
        if sifted and not self.started:
            self.started = rho is not None and rho >= float(self.threshold or 0.0)
        return StartDecision(self.started, rho)

    def state_dict(self) -> dict[str, Any]:
        return {"previous": torch.from_numpy(self.previous.copy()), "started": self.started}

    def check_state(self, state: Any) -> None:
        """Refuse a state that is not percentiles of this rank's ``n`` table entries (or none)."""
        self.check_sized(state, self.n)

    @staticmethod
    def check_sized(state: Any, n: int) -> None:
        """Refuse a state that is not a percentile (or NaN) per table entry (``n``; none: the rule was off)."""
        need_mapping(state, "start", ("previous", "started"))
        need_bool(state["started"], "start.started")
        previous = need_vector(state["previous"], "start.previous", torch.float32)
        if previous.shape[0] not in (0, n):
            invalid(
                "start.previous",
                f"must hold {n} entries (one per entry of this rank's table) or none, got {previous.shape[0]}",
            )
        need_values(previous, "start.previous", 0.0, 1.0, nan=True)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state of a run with the rule off (or of 0.8.0: none) has no percentiles: the next
        opening then has nothing to compare with, and its epoch trains every sample."""
        self.check_state(state)
        previous = state["previous"].numpy().astype(np.float32)
        if not self.enabled:
            previous = np.zeros(0, dtype=np.float32)
        elif previous.shape[0] == 0:
            previous = np.full(self.n, np.nan, dtype=np.float32)
        self.previous = previous.copy()
        self.started = bool(state["started"]) and self.enabled
