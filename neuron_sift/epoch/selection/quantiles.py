"""Percentiles of all scores without a global sort: a mergeable summary of each rank's scores.

Why: the exact percentile of a score among all ``N`` scores needs every score in one place
and one sort of all of them; at web scale that is gigabytes on every rank and a collective
as large as the table. Instead each part (a rank's share of the scores) is summarised by at
most ``knots`` weighted points, the parts' summaries are gathered (a fixed size whatever
``N``: ``knots + 1`` rows of two float64 per part) and merged, and every score's percentile
is read off the merged summary. Where a part has at most ``knots`` distinct scores its
summary is exact (its distinct values with their counts), so a single process with such a
table gets the exact mid-rank percentile of ``policy.percentile_of_all``.

The summary of a part with sorted finite scores ``v`` (``m`` of them): knots at the order
statistics ``v[ceil((j + 1) * m / knots) - 1]``, ``j = 0 .. knots - 1``; each knot's weight
is the number of scores in ``(previous knot, knot]``. Scores equal to a knot are counted
exactly; only the scores strictly between two consecutive knots (``uncertain``: at most
``ceil(m / knots) - 1`` per gap, the largest gap of the part is kept) are placed at the upper
knot. A score's mid-rank estimate is ``#{knots' weight below x} + 0.5 * weight at x``.

Error bound (tested against the exact percentile): for any score, the estimate differs
from the exact mid-rank count by at most the sum over parts of each part's ``uncertain``,
so the percentile is off by at most ``rank_error = sum(uncertain) / n``, less than
``1 / knots`` (0 where every part is exact).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from neuron_sift.shared.ranks import RankGroup

KNOTS = 4096  # points per part: a rank error below 1/4096 (0.025 percentile points)


@dataclass(frozen=True)
class ScoreSummary:
    """Sorted distinct knot ``values`` (float64 holding float32 scores) with their ``weights``
    (counts), the number of scores summarised (``count``), their sum (``total``: the mean of
    ``below_mean``) and the ``uncertain`` count that bounds the rank error."""

    values: np.ndarray
    weights: np.ndarray
    count: int
    total: float
    uncertain: int

    @property
    def rank_error(self) -> float:
        """The worst-case error of ``percentiles`` as a share of all scores (0: exact)."""
        return self.uncertain / self.count if self.count else 0.0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


def summarize(scores: np.ndarray, knots: int = KNOTS) -> ScoreSummary:
    """The summary of one part's ``scores`` (NaN: unscored, left out); ``O(m log m)``."""
    if knots < 1:
        raise ValueError(f"knots must be >= 1, got {knots}")
    values = np.asarray(scores, dtype=np.float32)
    v = np.sort(values[~np.isnan(values)]) + np.float32(0.0)  # -0.0 ties with 0.0
    m = int(v.shape[0])
    total = float(v.sum(dtype=np.float64))
    if m == 0:
        return ScoreSummary(np.empty(0), np.empty(0), 0, 0.0, 0)
    starts = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1])))  # v is sorted: runs of ties
    if starts.shape[0] <= knots:
        counts = np.diff(np.append(starts, m))
        return ScoreSummary(v[starts].astype(np.float64), counts.astype(np.float64), m, total, 0)
    positions = -(-(np.arange(1, knots + 1, dtype=np.int64) * m) // knots) - 1  # ceil((j+1) m / knots) - 1
    knot_values = v[positions]  # sorted; the last position is m - 1: the maximum is a knot
    knot_values = knot_values[np.concatenate((knot_values[1:] != knot_values[:-1], [True]))]
    at_or_below = np.searchsorted(v, knot_values, side="right")
    below = np.searchsorted(v, knot_values, side="left")
    weights = np.diff(at_or_below, prepend=0)
    between = below - np.concatenate(([0], at_or_below[:-1]))  # strictly between the knot and the one before
    return ScoreSummary(knot_values.astype(np.float64), weights.astype(np.float64), m, total, int(between.max()))


def merge(parts: Sequence[ScoreSummary]) -> ScoreSummary:
    """One summary of all ``parts``: their knots pooled (equal values combined); the
    uncertain counts add up, so the bound holds for the merged summary."""
    values = np.concatenate([p.values for p in parts]) if parts else np.empty(0)
    weights = np.concatenate([p.weights for p in parts]) if parts else np.empty(0)
    distinct, inverse = np.unique(values, return_inverse=True)
    pooled = np.zeros(distinct.shape[0], dtype=np.float64)
    np.add.at(pooled, inverse, weights)
    return ScoreSummary(
        distinct,
        pooled,
        sum(p.count for p in parts),
        float(sum(p.total for p in parts)),
        sum(p.uncertain for p in parts),
    )


def percentiles(summary: ScoreSummary, scores: np.ndarray) -> np.ndarray:
    """Mid-rank percentile of each of ``scores`` among the summarised scores, float32, within
    ``summary.rank_error`` of the exact one; 1.0 for NaN (as ``percentile_of_all``)."""
    values = np.asarray(scores, dtype=np.float32)
    out = np.ones(values.shape[0], dtype=np.float32)
    seen = ~np.isnan(values)
    if summary.count == 0 or not seen.any():
        return out
    x = values[seen] + np.float32(0.0)
    knots = summary.values.astype(np.float32)  # float32 scores: exact
    cum = np.concatenate(([0.0], np.cumsum(summary.weights)))
    left = np.searchsorted(knots, x, side="left")
    at = np.minimum(left, knots.shape[0] - 1)
    right = left + (knots[at] == x)  # knots are distinct: at most one equals x
    less, through = cum[left], cum[right]  # weight below x, and at or below x
    # The same float32 arithmetic as percentile_of_all: (left + right) / 2 / n, ties counting half.
    out[seen] = ((less + through).astype(np.float32) * np.float32(0.5)) / np.float32(summary.count)
    return out


def quantile_value(summary: ScoreSummary, q: float) -> float | None:
    """A score whose share of summarised scores at or below it is at least ``q`` and whose
    share strictly below it is at most ``q`` (the lower ``q`` quantile), within
    ``summary.rank_error``; None when nothing is summarised."""
    if summary.count == 0:
        return None
    cum = np.cumsum(summary.weights)
    at = int(np.searchsorted(cum, q * summary.count, side="left"))
    return float(summary.values[min(at, summary.values.shape[0] - 1)])


def _pack(summary: ScoreSummary, knots: int) -> torch.Tensor:
    """``[knots + 2, 2]`` float64: (count, total), (uncertain, 0), then the knots padded with
    (+inf, 0): the same shape on every rank, whatever it holds."""
    rows = np.zeros((knots + 2, 2), dtype=np.float64)
    rows[0] = (summary.count, summary.total)
    rows[1, 0] = summary.uncertain
    rows[2:, 0] = np.inf
    k = summary.values.shape[0]
    rows[2 : k + 2, 0] = summary.values
    rows[2 : k + 2, 1] = summary.weights
    return torch.from_numpy(rows)


def _unpack(rows: np.ndarray) -> ScoreSummary:
    count, total = rows[0]
    uncertain = rows[1, 0]
    knots = rows[2:]
    used = knots[:, 1] > 0
    return ScoreSummary(knots[used, 0].copy(), knots[used, 1].copy(), int(count), float(total), int(uncertain))


def summarize_over_ranks(scores: np.ndarray, ranks: RankGroup, knots: int = KNOTS) -> ScoreSummary:
    """The merged summary of every rank's ``scores`` (its own part), the same on every rank:
    one all-gather of ``(knots + 2) * 16`` bytes per rank, whatever the number of scores."""
    mine = summarize(scores, knots)
    if not ranks.active:
        return mine
    gathered = ranks.all_gather_rows(_pack(mine, knots)).numpy().reshape(ranks.world_size, knots + 2, 2)
    return merge([_unpack(part) for part in gathered])
