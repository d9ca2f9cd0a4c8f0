"""Percentile of each new loss within the loss history."""

import torch


def percentile_rank(losses: torch.Tensor, history: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """Mid-rank percentile of ``losses[i]`` among the first ``fill`` entries of ``history``.

    ``(#{h < l} + 0.5 * #{h == l}) / fill``: ties count half, so a batch of equal losses
    against an equal history sits at 0.5 rather than at 0 or 1. Only the first ``fill``
    slots are valid (the ring buffer fills from slot 0), which keeps the shape ``[H]``
    static while the history is filling. With an empty history (``fill == 0``) every
    percentile is 1.0: with nothing to compare against, nothing is judged easy.

    Non-finite losses get whatever the comparison gives; callers decide what to do with
    them (the history itself never holds a non-finite value).

    Cost is B x H comparisons; fine for the documented sizes (see benchmarks/).
    """
    h = history.shape[0]
    valid = torch.arange(h, device=history.device) < fill  # [H]
    l = losses.to(history.dtype).unsqueeze(1)  # [B, 1]
    hist = history.unsqueeze(0)  # [1, H]
    less = ((hist < l) & valid).sum(dim=1, dtype=torch.int64)
    equal = ((hist == l) & valid).sum(dim=1, dtype=torch.int64)
    denom = torch.clamp(fill, min=1).to(history.dtype)
    pct = (less.to(history.dtype) + 0.5 * equal.to(history.dtype)) / denom
    return torch.where(fill > 0, pct, torch.ones_like(pct))
