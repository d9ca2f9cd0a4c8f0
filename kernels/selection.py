"""Keep probabilities and the two draws: independent (probabilistic) and exactly-k (fixed)."""

from typing import Optional, Tuple

import torch

# Percentiles are floored here before taking logs, so log-weights stay finite and a
# valid row always outranks a padding row (whose log-weight is -inf).
_MIN_PERCENTILE = 1e-12


def keep_probability(pct: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Selective Backprop's keep probability ``pct ** beta`` (``beta`` > 0)."""
    return torch.pow(pct, beta)


def keep_log_probability(pct: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``beta * log(pct)``, computed in log space so large ``beta`` does not underflow."""
    return beta * torch.log(torch.clamp(pct, min=_MIN_PERCENTILE))


def bernoulli_keep(p: torch.Tensor, u: torch.Tensor, valid: torch.Tensor, force: torch.Tensor) -> torch.Tensor:
    """Keep row i when it is valid and (``u[i] < p[i]`` or ``force[i]``).

    ``force`` marks rows kept regardless of the draw (non-finite losses, which must be
    seen by training, never silently dropped). Padding rows (``valid`` False) are never kept.
    """
    return valid & ((u < p) | force)


def gumbel_topk_indices(
    log_p: torch.Tensor,
    u: torch.Tensor,
    valid: torch.Tensor,
    force: torch.Tensor,
    k: int,
    n_take: torch.Tensor,
    picks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Draw ``k`` rows without replacement with probabilities proportional to ``exp(log_p)``.

    Gumbel-top-k: the ``k`` largest ``log_p + Gumbel`` scores are a weighted sample
    without replacement. Forced rows score ``+inf`` (taken first), padding rows ``-inf``
    (taken last). For a short batch only the first ``n_take <= k``
    picks count; the caller passes ``n_take`` (rows to take, a device scalar) and gets a
    mask. Returns ``(indices[k], taken[k])`` with the taken indices sorted ascending first,
    so an emitted batch keeps the source order.
    """
    b = log_p.shape[0]
    gumbel = -torch.log(-torch.log(u))
    score = log_p + gumbel
    score = torch.where(force, torch.full_like(score, float("inf")), score)
    score = torch.where(valid, score, torch.full_like(score, float("-inf")))
    _, top = torch.topk(score, k, sorted=True)
    if picks is None:  # arange(k); pass it in to keep it out of an XLA trace
        picks = torch.arange(k, device=log_p.device)
    taken = picks < n_take
    # Sort the taken indices ascending; untaken ones move to the end.
    key = torch.where(taken, top, top + b)
    key, _ = torch.sort(key)
    taken_sorted = key < b
    indices = torch.where(taken_sorted, key, key - b)
    return indices, taken_sorted


def compact_indices(keep: torch.Tensor, rows: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Kept row indices first (in source order), then the others; plus the kept count.

    The static-shape replacement for ``keep.nonzero()``: ``indices[:count]`` are the kept
    rows. Only ``count`` is data dependent, and it stays a device scalar.
    """
    b = keep.shape[0]
    if rows is None:  # arange(b); pass it in to keep it out of an XLA trace
        rows = torch.arange(b, device=keep.device)
    key = torch.where(keep, rows, rows + b)
    key, _ = torch.sort(key)
    indices = torch.where(key < b, key, key - b)
    return indices, keep.to(torch.int64).sum()
