"""Keep probabilities and the three choices: independent draws (probabilistic), exactly-k
draws (fixed) and the k highest scores (topk)."""

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
    picks: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``k`` rows without replacement with probabilities proportional to ``exp(log_p)``.

    Gumbel-top-k: the ``k`` largest ``log_p + Gumbel`` scores are a weighted sample
    without replacement (``top_k_indices`` takes them).
    """
    gumbel = -torch.log(-torch.log(u))
    return top_k_indices(log_p + gumbel, valid, force, k, n_take, picks, rows)


def top_k_indices(
    score: torch.Tensor,
    valid: torch.Tensor,
    force: torch.Tensor,
    k: int,
    n_take: torch.Tensor,
    picks: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` rows of highest ``score``. Forced rows score ``+inf`` (taken first), padding
    rows ``-inf`` (taken last). For a short batch only the first ``n_take <= k``
    picks count; the caller passes ``n_take`` (rows to take, a device scalar) and gets a
    mask. Returns ``(indices[k], taken[k])``: the taken rows ascending (so an emitted batch
    keeps the source order), then the chosen but untaken rows ascending.

    The one ``topk`` ranks floats. The taken rows are put in source order by marking them
    in a ``[B]`` vector and compacting it (cumsum and an overwrite scatter), not by sorting
    integer indices: Neuron's compiler rejects TopK on integers (NCC_EVRF013) and may turn
    a sort followed by a slice into one.
    """
    b = score.shape[0]
    score = torch.where(force, torch.full_like(score, float("inf")), score)
    score = torch.where(valid, score, torch.full_like(score, float("-inf")))
    _, top = torch.topk(score, k, sorted=True)
    if picks is None:  # arange(k); pass it in to keep it out of an XLA trace
        picks = torch.arange(k, device=score.device)
    if rows is None:  # arange(B), likewise
        rows = torch.arange(b, device=score.device)
    taken = picks < n_take
    # mark[i]: 1 taken, 2 chosen but not taken, 0 not chosen (top holds distinct rows).
    mark = torch.zeros_like(rows).scatter(0, top, torch.where(taken, torch.ones_like(top), torch.full_like(top, 2)))
    is_taken = (mark == 1).to(torch.int64)
    is_rest = (mark == 2).to(torch.int64)
    n_taken = is_taken.sum()
    slot = torch.where(
        mark == 1,
        torch.cumsum(is_taken, dim=0) - is_taken,
        torch.where(mark == 2, n_taken + torch.cumsum(is_rest, dim=0) - is_rest, torch.full_like(rows, k)),
    )
    # Rows not chosen all go to the scratch slot k (dropped): the kept slots never collide.
    indices = torch.zeros(k + 1, dtype=rows.dtype, device=rows.device).scatter(0, slot, rows)[:k]
    return indices, picks < n_taken


def compact_indices(keep: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept row indices first (in source order), then the others (in source order); plus the kept count.

    The static-shape replacement for ``keep.nonzero()``: ``indices[:count]`` are the kept
    rows. Only ``count`` is data dependent, and it stays a device scalar. A stable
    partition by cumsum and one overwrite scatter (each row's slot is known), not a sort:
    O(B), and no sort of integers, which Neuron's compiler may turn into a TopK on
    integers (NCC_EVRF013).
    """
    b = keep.shape[0]
    if rows is None:  # arange(b); pass it in to keep it out of an XLA trace
        rows = torch.arange(b, device=keep.device)
    kept = keep.to(torch.int64)
    count = kept.sum()
    kept_before = torch.cumsum(kept, dim=0) - kept
    slot = torch.where(keep, kept_before, count + (rows - kept_before))  # a permutation of [0, b)
    return torch.zeros_like(rows).scatter(0, slot, rows), count
