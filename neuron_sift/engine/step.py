"""One source batch through the selection math: a pure function of tensors.

``sift_step`` is the whole device-side work per source batch: rank the losses against
the history, compute keep probabilities, draw, update the ring buffer and counters. Its
shapes depend only on (P, H, k): P the padded batch size, H the history length, k the
fixed-mode keep count. Data-dependent quantities (valid rows, rows to take) come in as
device scalars, so a short batch runs the same graph.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from neuron_sift.engine.state import SiftState
from neuron_sift.kernels import (
    bernoulli_keep,
    gumbel_topk_indices,
    keep_log_probability,
    keep_probability,
    percentile_rank,
    ring_buffer_update,
    uniform_from_counter,
)


@dataclass
class StepOutput:
    """Per-batch result, all device tensors.

    probabilistic: ``keep`` is the ``[P]`` bool mask; ``indices``/``taken`` are None.
    fixed: ``indices`` ``[k]`` (taken ones first, ascending) and ``taken`` ``[k]`` bool.
    ``percentiles`` ``[P]`` for logging/metrics.
    """

    keep: Optional[torch.Tensor]
    indices: Optional[torch.Tensor]
    taken: Optional[torch.Tensor]
    percentiles: torch.Tensor
    num_kept: torch.Tensor


def sift_step(
    state: SiftState,
    losses: torch.Tensor,
    n_valid: torch.Tensor,
    beta: torch.Tensor,
    mode: str,
    k: int,
    n_take: torch.Tensor,
) -> Tuple[SiftState, StepOutput]:
    p_rows = losses.shape[0]
    device = losses.device
    losses = losses.to(torch.float32)
    valid = torch.arange(p_rows, device=device) < n_valid
    finite = torch.isfinite(losses)
    force = valid & ~finite  # non-finite losses: always kept, never recorded
    record = valid & finite
    safe = torch.where(finite, losses, torch.zeros_like(losses))
    pct = percentile_rank(safe, state.history, state.fill)
    u = uniform_from_counter(state.seed, state.draws, p_rows)
    if mode == "probabilistic":
        keep = bernoulli_keep(keep_probability(pct, beta), u, valid, force)
        num_kept = keep.to(torch.int64).sum()
        out = StepOutput(keep=keep, indices=None, taken=None, percentiles=pct, num_kept=num_kept)
    elif mode == "fixed":
        log_p = keep_log_probability(pct, beta)
        indices, taken = gumbel_topk_indices(log_p, u, valid, force, k, n_take)
        num_kept = taken.to(torch.int64).sum()
        out = StepOutput(keep=None, indices=indices, taken=taken, percentiles=pct, num_kept=num_kept)
    else:
        raise ValueError(f"unknown selection mode {mode!r}")
    history, pos, fill = ring_buffer_update(state.history, state.pos, state.fill, safe, record)
    new_state = SiftState(
        history=history,
        pos=pos,
        fill=fill,
        seed=state.seed,
        draws=state.draws + 1,
        num_scored=state.num_scored + valid.to(torch.int64).sum(),
        num_kept=state.num_kept + num_kept,
        num_nonfinite=state.num_nonfinite + force.to(torch.int64).sum(),
    )
    return new_state, out
