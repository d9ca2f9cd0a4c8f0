"""One source batch through the selection math: a pure function of tensors.

``sift_step`` is the whole device-side work per source batch: rank the losses against
the history, compute keep probabilities, draw, update the ring buffer and counters. Its
shapes depend only on (P, H, k): P the padded batch size, H the history length, k the
fixed-mode keep count. Data-dependent quantities (valid rows, rows to take) come in as
device scalars, so a short batch runs the same graph. What differs by device (the sort
method of the percentile kernel) comes in as a static argument from the backend: the
step never asks what device it runs on.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from neuron_sift.engine.state import SiftState
from neuron_sift.kernels import (
    bernoulli_keep,
    compact_indices,
    gumbel_topk_indices,
    keep_log_probability,
    keep_probability,
    ring_buffer_update,
    top_k_indices,
)
from neuron_sift.kernels.percentile import percentile_rank_auto
from neuron_sift.kernels.random import row_keys, seed_key, uniform_from_keys


@dataclass
class StepConstants:
    """Per-run tensors the step would otherwise rebuild for every source batch: index
    vectors (rows, history slots, fixed-mode picks) and the hash keys of the rows and the
    seed. On XLA every op of the step is traced anew per source batch, and torch-xla builds
    an ``arange`` on the host each time; made once, they enter the graph as device data."""

    rows: torch.Tensor  # arange(P)
    row_hash: torch.Tensor
    seed_mix: torch.Tensor
    slots: torch.Tensor  # arange(H)
    picks: torch.Tensor  # arange(k)

    @classmethod
    def create(cls, p_rows: int, history: int, k: int, seed: int, device: torch.device) -> "StepConstants":
        """Computed on the CPU and uploaded: device data, not ops in the step's graph."""
        rows, row_hash = row_keys(p_rows, torch.device("cpu"))
        seed_mix = seed_key(torch.tensor(seed, dtype=torch.int64))
        return cls(
            rows=rows.to(device),
            row_hash=row_hash.to(device),
            seed_mix=seed_mix.to(device),
            slots=torch.arange(history).to(device),
            picks=torch.arange(k).to(device),
        )


@dataclass
class StepOutput:
    """Per-batch result, all device tensors: only what the loader reads or gathers with.

    ``order``: row indices with the kept rows first, in source order (``[P]`` in
    probabilistic mode, ``[k]`` in fixed mode); ``count``: how many of them are kept;
    ``num_nonfinite``: non-finite valid losses in this batch. Nothing else is kept alive:
    on XLA every live output is materialised at the next sync.
    """

    order: torch.Tensor
    count: torch.Tensor
    num_nonfinite: torch.Tensor


def sift_step(
    state: SiftState,
    losses: torch.Tensor,
    n_valid: torch.Tensor,
    beta: torch.Tensor,
    mode: str,
    k: int,
    n_take: torch.Tensor,
    shared_losses: torch.Tensor | None = None,
    shared_valid: torch.Tensor | None = None,
    consts: StepConstants | None = None,
    sort_method: str = "search",
) -> tuple[SiftState, StepOutput]:
    """One source batch. ``shared_losses``/``shared_valid`` (``[W * P]``, every rank's
    padded losses in rank order) make the history global: this rank's losses are ranked
    against it, and all ranks' losses are recorded, so every rank holds the same history.
    ``consts``: ``StepConstants.create(P, H, k, seed, device)``, reused across calls (built here,
    with a read of the seed, if None). ``sort_method``: the percentile kernel's sort-based
    formulation (``percentile_rank_auto``'s ``method``), static like ``mode`` and ``k``:
    the backend's ``"merge"`` on XLA, ``"search"`` elsewhere; the results are the same."""
    p_rows = losses.shape[0]
    if consts is None:
        consts = StepConstants.create(p_rows, state.history.shape[0], k, int(state.seed), losses.device)
    losses = losses.to(torch.float32)
    valid = consts.rows < n_valid
    finite = torch.isfinite(losses)
    force = valid & ~finite  # non-finite losses: always kept, never recorded
    record = valid & finite
    safe = torch.where(finite, losses, torch.zeros_like(losses))
    # = percentile_rank, faster at large B x H
    pct = percentile_rank_auto(safe, state.history, state.fill, consts.slots, method=sort_method)
    u = uniform_from_keys(consts.seed_mix, state.draws, consts.rows, consts.row_hash)
    num_nonfinite = force.to(torch.int64).sum()
    if mode == "probabilistic":
        keep = bernoulli_keep(keep_probability(pct, beta), u, valid, force)
        order, count = compact_indices(keep, consts.rows)
    elif mode == "fixed":
        log_p = keep_log_probability(pct, beta)
        order, taken = gumbel_topk_indices(log_p, u, valid, force, k, n_take, consts.picks, consts.rows)
        count = taken.to(torch.int64).sum()
    elif mode == "topk":  # the k highest losses: no draw
        order, taken = top_k_indices(safe, valid, force, k, n_take, consts.picks, consts.rows)
        count = taken.to(torch.int64).sum()
    else:
        raise ValueError(f"unknown selection mode {mode!r}")
    out = StepOutput(order=order, count=count, num_nonfinite=num_nonfinite)
    if shared_losses is not None:
        if shared_valid is None:
            raise ValueError("sift_step: shared_losses needs shared_valid (the valid rows of every rank's losses)")
        shared_losses = shared_losses.to(torch.float32)
        shared_finite = torch.isfinite(shared_losses)
        record = shared_valid & shared_finite
        safe = torch.where(shared_finite, shared_losses, torch.zeros_like(shared_losses))
    history, pos, fill = ring_buffer_update(state.history, state.pos, state.fill, safe, record)
    new_state = SiftState(
        history=history,
        pos=pos,
        fill=fill,
        seed=state.seed,
        draws=state.draws + 1,
        num_scored=state.num_scored + valid.to(torch.int64).sum(),
        num_kept=state.num_kept + count,
        num_nonfinite=state.num_nonfinite + num_nonfinite,
    )
    return new_state, out


# -- the step as a function of a flat tuple of tensors -------------------------------------
# Backends that build the step's graph once (torch-xla's assume_pure, torch.compile) need a
# function whose every input is a tensor argument: nothing captured that changes between
# calls, so the graph built on the first call stays right for every later one.

_N_STATE = len(fields(SiftState))  # in the order of SiftState.tensors()
_N_CONSTS = len(fields(StepConstants))


def flat_step(
    mode: str, k: int, shared: bool, step_fn: Callable | None = None, sort_method: str = "search"
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``sift_step`` (or ``step_fn``, with its signature) for one (mode, k, global history
    or not, sort method) as ``f(*flat_inputs(...))``, returning the new state's tensors
    then ``order``, ``count``, ``num_nonfinite``. Every argument here is static: a cache
    of built steps keys on all of them."""
    run = sift_step if step_fn is None else step_fn

    def step(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = SiftState(*tensors[:_N_STATE])
        losses, per_batch, beta = tensors[_N_STATE : _N_STATE + 3]
        consts = StepConstants(*tensors[_N_STATE + 3 : _N_STATE + 3 + _N_CONSTS])
        shared_losses, shared_valid = tensors[_N_STATE + 3 + _N_CONSTS :] if shared else (None, None)
        s, out = run(
            state,
            losses,
            per_batch[0],
            beta,
            mode,
            k,
            per_batch[1],
            shared_losses,
            shared_valid,
            consts,
            sort_method=sort_method,
        )
        return (*s.tensors().values(), out.order, out.count, out.num_nonfinite)

    step.__name__ = f"sift_step_{mode}"
    return step


def flat_inputs(
    state: SiftState,
    losses: torch.Tensor,
    per_batch: torch.Tensor,
    beta: torch.Tensor,
    consts: StepConstants,
    shared_losses: torch.Tensor | None = None,
    shared_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """The inputs of ``flat_step``: ``per_batch`` is the ``[2]`` vector (valid rows, rows to take)."""
    tensors = (
        *state.tensors().values(),
        losses,
        per_batch,
        beta,
        *(getattr(consts, f.name) for f in fields(StepConstants)),
    )
    if shared_losses is None:
        return tensors
    if shared_valid is None:
        raise ValueError("flat_inputs: shared_losses needs shared_valid (the valid rows of every rank's losses)")
    return tensors + (shared_losses, shared_valid)


def from_flat(outputs: tuple[torch.Tensor, ...]) -> tuple[SiftState, StepOutput]:
    """``flat_step``'s outputs as the new state and the step's output."""
    order, count, num_nonfinite = outputs[_N_STATE:]
    return SiftState(*outputs[:_N_STATE]), StepOutput(order=order, count=count, num_nonfinite=num_nonfinite)
