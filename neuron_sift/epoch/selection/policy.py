"""The epoch policy's arithmetic: scores -> keep probabilities -> inclusion probabilities -> loss weights.

Pure functions (each policy's rule is an entry of ``policies.py``, built from the config),
run by the planner on the host once per epoch (NumPy: a plan is a host
job, and there one ``argsort``, run-length tie handling on the sorted values and a
water-filling by fixed-point iteration do the work in a few passes over the table). The
planner (``planning/planner.py``) draws the kept set from the inclusion probabilities; the loader
applies the weights.

Why the weights make the loss unbiased (the derivation the README repeats): a sifted
epoch keeps sample ``i`` with probability ``pi_i > 0`` and weights its loss by
``1 / pi_i``. With ``K_i`` the indicator that ``i`` is kept (``E[K_i] = pi_i``), the
epoch's weighted loss ``L_w = (1/N) * sum_i K_i * l_i / pi_i`` has expectation
``(1/N) * sum_i pi_i * l_i / pi_i = (1/N) * sum_i l_i``: the full-data loss, for any
fixed scores and losses, whatever the joint distribution of the ``K_i`` (only the
marginals enter, so systematic sampling with a fixed kept count is as unbiased as
independent draws). Bias appears only where the weight is not ``1 / pi_i``: a sample
with ``pi_i = 0`` (the noise guard's excluded samples: deliberately out of the
objective) and a weight clipped by ``max_weight`` (``E`` then falls short by
``(1 - pi_i * max_weight) * l_i / N`` for each such sample).
"""

import numpy as np
import torch

from neuron_sift.epoch.selection.quantiles import ScoreSummary, percentiles


def percentile_of_all(scores: np.ndarray) -> np.ndarray:
    """Mid-rank percentile of every scored value among all scored values: for a scored
    sample ``(#{s < x} + 0.5 * #{s == x}) / n_scored`` (itself one of the ties; -0.0 ties
    with 0.0); 1.0 for unscored (NaN) samples, nothing judges them easy. float32."""
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


def percentile_priorities(
    scores: np.ndarray, beta_value: float, min_keep_probability: float, summary: ScoreSummary | None = None
) -> np.ndarray:
    """``max(min_keep_probability, percentile ** beta_value)``, the percentile among all recorded
    scores with ties counting half (read off ``summary`` when given, within its rank error); 1
    where never scored. float32."""
    scores = np.asarray(scores, dtype=np.float32)
    pct = percentile_of_all(scores) if summary is None else percentiles(summary, scores)
    # In float64, rounded once: NumPy's float32 power is not correctly rounded and differs
    # between builds (1.26 on AVX-512 even gives pct ** 1 != pct), so plans would too.
    p = np.clip(np.power(pct.astype(np.float64), float(beta_value)), min_keep_probability, 1.0).astype(np.float32)
    p[np.isnan(scores)] = 1.0
    return p


def below_mean_priorities(scores: np.ndarray, prune_ratio: float, summary: ScoreSummary | None = None) -> np.ndarray:
    """``1 - prune_ratio`` below the mean of the recorded scores (``summary``'s mean when given),
    else 1; 1 where never scored. float32."""
    scores = np.asarray(scores, dtype=np.float32)
    seen = ~np.isnan(scores)
    vals = scores[seen].astype(np.float64)
    mean = vals.sum() / max(vals.shape[0], 1) if summary is None else summary.mean
    below = seen & (np.where(seen, scores, 0).astype(np.float64) < mean)
    return np.where(below, np.float32(1.0 - prune_ratio), np.float32(1.0)).astype(np.float32)


def scale_to_count(priorities: np.ndarray, count: float, forced: np.ndarray | None = None) -> np.ndarray:
    """Inclusion probabilities ``pi = min(1, c * p)`` summing to ``count`` (water-filling), float64.

    ``priorities``: ``[N]`` in ``[0, 1]`` (0: never kept); ``count``: the number of samples
    to keep; ``forced``: ``[N]`` bool, samples kept for sure (``pi = 1``, taken out of the
    count first). One common factor ``c`` keeps the policy's relative preferences; samples
    that would exceed 1 are capped and the rest share what is left, found by fixed-point
    iteration on the capped set (it only grows, so at most N passes; in practice a
    handful). If the count is at least the number of eligible samples, every eligible
    sample gets 1; if the forced samples alone exceed the count, they share it uniformly
    and the others get 0 (the caller's documented exception).
    """
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


def loss_weights(inclusion: torch.Tensor, max_weight: float | None = None) -> torch.Tensor:
    """``1 / pi`` for every sample with ``pi > 0`` (1 elsewhere: such a sample is never
    trained on), optionally clipped at ``max_weight`` (biased where it clips). float32."""
    pi = inclusion.to(torch.float64)
    w = torch.where(pi > 0, 1.0 / torch.clamp(pi, min=1e-300), torch.ones_like(pi))
    if max_weight is not None:
        w = torch.clamp(w, max=max_weight)
    return w.to(torch.float32)
