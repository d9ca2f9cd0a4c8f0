"""The policy's host formulation (NumPy), used by the planner: identical results to the
tensor functions of ``policy.py`` (tested), faster on the host for large tables.

Why a second formulation: planning runs on the host once per epoch, and there the tensor
formulation's costs are a full ``torch.sort`` and ``searchsorted`` over unsorted queries.
Here one ``argsort``, run-length tie handling on the sorted values, and a water-filling by
fixed-point iteration (a few passes over the table instead of a sort) do the same work
with fewer passes; ``benchmarks/epoch_machinery.py`` times it.
"""

import numpy as np


def percentile_of_all_np(scores: np.ndarray) -> np.ndarray:
    """``kernels.scores.percentile_of_all`` in NumPy: mid-rank percentile (ties count half)
    of each scored value among all scored values; 1.0 for unscored (NaN) entries."""
    scores = np.asarray(scores, dtype=np.float32)
    out = np.ones(scores.shape[0], dtype=np.float32)
    seen = ~np.isnan(scores)
    values = scores[seen]
    m = values.shape[0]
    if m == 0:
        return out
    values = values + np.float32(0.0)  # -0.0 -> 0.0
    order = np.argsort(values)
    v = values[order]
    idx = np.arange(m)
    starts = np.empty(m, dtype=bool)
    starts[0] = True
    np.not_equal(v[1:], v[:-1], out=starts[1:])
    left = np.maximum.accumulate(np.where(starts, idx, 0))  # first index of each run of ties
    ends = np.empty(m, dtype=bool)
    ends[-1] = True
    ends[:-1] = starts[1:]
    right = np.minimum.accumulate(np.where(ends, idx + 1, m)[::-1])[::-1]  # one past the run's end
    mid = np.empty(m, dtype=np.float32)
    mid[order] = ((left + right).astype(np.float32) * np.float32(0.5)) / np.float32(m)
    out[seen] = mid
    return out


def keep_priorities_np(
    scores: np.ndarray,
    policy: str,
    beta_value: float = 1.0,
    min_keep_probability: float = 0.05,
    prune_ratio: float = 0.5,
) -> np.ndarray:
    """``policy.keep_priorities`` in NumPy (float32; unscored samples get 1)."""
    scores = np.asarray(scores, dtype=np.float32)
    seen = ~np.isnan(scores)
    if policy == "percentile":
        pct = percentile_of_all_np(scores)
        p = np.clip(np.power(pct, np.float32(beta_value)), min_keep_probability, 1.0).astype(np.float32)
    elif policy == "below_mean":
        vals = scores[seen].astype(np.float64)
        mean = vals.sum() / max(vals.shape[0], 1)
        below = seen & (np.where(seen, scores, 0).astype(np.float64) < mean)
        p = np.where(below, np.float32(1.0 - prune_ratio), np.float32(1.0)).astype(np.float32)
    else:
        raise ValueError(f"unknown policy {policy!r}")
    p[~seen] = 1.0
    return p


def scale_to_count_np(priorities: np.ndarray, count: float, forced: np.ndarray | None = None) -> np.ndarray:
    """``policy.scale_to_count`` in NumPy (float64): ``pi = min(1, c * p)`` summing to
    ``count``, ``forced`` samples at 1, found by fixed-point iteration on the capped set
    (it only grows, so at most N passes; in practice a handful)."""
    p = np.asarray(priorities, dtype=np.float64)
    forced = np.zeros(p.shape[0], dtype=bool) if forced is None else np.asarray(forced, dtype=bool)
    n_forced = int(forced.sum())
    if n_forced >= count:
        share = min(1.0, count / max(n_forced, 1))
        return np.where(forced, share, 0.0)
    free = np.where(forced, 0.0, p)
    left = count - n_forced
    eligible = free > 0
    if left >= eligible.sum():
        return np.where(forced | eligible, 1.0, 0.0)
    capped = np.zeros(p.shape[0], dtype=bool)
    n_capped = 0
    c = left / free.sum()
    while True:
        rest = free[~capped].sum()
        c = (left - n_capped) / rest
        now = capped | (c * free >= 1.0)
        n_now = int(now.sum())
        if n_now == n_capped:
            break
        capped, n_capped = now, n_now
    pi = np.where(capped, 1.0, np.minimum(1.0, c * free))
    return np.where(forced, 1.0, pi)
