"""Kernels of epoch-level sifting: the per-sample score table and its weights.

One score per dataset sample (its most recent training loss) in a table of ``N + 1``
slots; the last slot is a trash slot that absorbs writes which must not land (non-finite
losses), so every write is a scatter of a static shape. A NaN slot means "never scored".
Pure functions: tensors in, tensors out, shapes fixed by the input shapes, no host reads;
they run eagerly on CPU/CUDA and trace into fixed XLA graphs.
"""

import torch


def new_score_table(n: int, device: torch.device | None = None) -> torch.Tensor:
    """``[n + 1]`` float32 NaN: no sample scored yet; slot ``n`` is the trash slot."""
    return torch.full((n + 1,), float("nan"), dtype=torch.float32, device=device)


def score_writes(
    ids: torch.Tensor, losses: torch.Tensor, trash: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The scatter that records ``losses`` at ``ids``: ``(slots, values, n_nonfinite)``.

    A non-finite loss is redirected to slot ``trash`` (value 0), so it never reaches a
    real slot and the sample keeps its previous score (or stays unscored). ``ids``: ``[n]``
    int64, distinct, in ``[0, trash)``; ``losses``: ``[n]`` floating, any precision
    (detached and upcast to float32 here). ``n_nonfinite``: int64, 0-dim. Apply with
    ``table.index_put_((slots,), values)`` (in place) or use ``record_scores``.
    """
    values = losses.detach().to(torch.float32)
    finite = torch.isfinite(values)
    slots = torch.where(finite, ids, torch.full_like(ids, trash))
    values = torch.where(finite, values, torch.zeros_like(values))
    return slots, values, (~finite).sum()


def smoothed(previous: torch.Tensor, values: torch.Tensor, smoothing: float) -> torch.Tensor:
    """A moving average of each sample's losses: ``smoothing * value + (1 - smoothing) *
    previous`` where the sample has a previous score, the value itself where it has none
    (NaN). Elementwise, float32; ``smoothing`` in (0, 1]."""
    mixed = values * smoothing + previous * (1.0 - smoothing)
    return torch.where(torch.isnan(previous), values, mixed)


def record_scores(table: torch.Tensor, ids: torch.Tensor, losses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The table with ``losses`` written at ``ids`` (non-finite ones to the trash slot), and
    the number of non-finite losses. ``table``: ``[N + 1]`` float32 (see ``score_writes``)."""
    slots, values, nonfinite = score_writes(ids, losses, table.shape[0] - 1)
    return table.index_put((slots,), values.to(table.dtype)), nonfinite


def gather_weights(weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The loss weight of each sample of a batch: ``weights[ids]`` (a static-shape gather)."""
    return weights.index_select(0, ids)


def weighted_mean(losses: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum(weights * losses) / n``, in float32 at least (bf16/fp16 losses are upcast,
    float64 stays float64).

    Differentiable in ``losses``. Non-finite losses stay in the result: training shows
    them exactly as it would without sifting.
    """
    dtype = torch.promote_types(losses.dtype, torch.float32)
    return (losses.to(dtype) * weights.to(dtype)).sum() / losses.shape[0]
