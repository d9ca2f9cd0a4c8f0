"""``sift_step`` for CPU tensors, on the host: the same results as the torch step, bit for bit.

Why a second formulation: on a CPU the step runs once per source batch between the
DataLoader's and the training step's work, with cold caches, where each of the torch
step's ~100 small ops costs several microseconds and ``torch.sort`` of the history ~160 us
(H = 4096). That was ~1 ms per source batch, 15% of a training step of the benchmark's
default model (benchmarks/machinery.py). Here the state lives on the host (a NumPy history
and Python ints, updated in place), the valid rows are a prefix (sliced, not masked), and
the ranking and the history update are one call each into ``neuron_sift.kernels._host``
(C, kernels/_host.c), which keeps the history sorted across steps instead of sorting it.
Where that extension was not built (no C compiler at install), the same two steps run as
NumPy calls here (``_rank_numpy``, ``_record_numpy``, ``uniforms_numpy``), about 1.5x
the machinery time (benchmarks/machinery.py, B = 256, H = 4096: 0.51 against 0.35 ms).

Bit-exact with ``engine.step.sift_step`` (tests/neuron_sift/engine/test_cpu_step.py):
the counts, the hash random numbers and the ring buffer are integer arithmetic; the
percentile is the same float32 division; the transcendental steps (``pct ** beta``, the
logs of the fixed mode's Gumbel draw) and ``topk`` (whose tie order decides between equal
scores) are computed by the very same torch ops on the same shapes.

Only for CPU tensors; the eager backend uses it on the CPU, the torch step runs everywhere
else (CUDA, XLA).
"""

from dataclasses import dataclass, field, fields
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from neuron_sift.engine.state import SiftState

try:
    from neuron_sift.kernels import _host
except ImportError:  # built without a C compiler: the NumPy formulation below
    _host = None
from neuron_sift.kernels.random import _GOLDEN, _MASK31, _mix31
from neuron_sift.kernels.selection import _MIN_PERCENTILE


def uniforms_numpy(seed: int, counter: int, n: int) -> np.ndarray:
    """``kernels.random.uniform_from_counter`` as a float32 NumPy array (identical values).

    ``_mix31`` is operator arithmetic, so the torch kernel's own mixer hashes NumPy int64
    arrays and Python ints alike (every product stays below 2**61).
    """
    key = _mix31(_mix31(seed + _GOLDEN) ^ (counter & _MASK31))
    rows = np.arange(n, dtype=np.int64)
    h = _mix31(_mix31(key ^ _mix31(rows + _GOLDEN)) + rows)
    return ((h >> 8).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 8388608.0)


def _rank_numpy(values: np.ndarray, history: np.ndarray, fill: int, out: np.ndarray) -> None:
    """Mid-rank percentiles of ``values`` (finite) among ``history[:fill]``, float32, into ``out``.

    ``(#{h < v} + #{h <= v}) / 2 / fill``, the same float32 division as the torch
    kernels. One binary search per value; a second (``#{h <= v}``) only for the values
    that equal a history entry. Random queries make every search step a branch
    misprediction, so searching is the costly part of the step.
    """
    if fill == 0:  # nothing to compare against: nothing is judged easy
        out[:] = 1.0
        return
    # ndarray methods and ufuncs rather than NumPy's Python-level wrappers: called once
    # per source batch from a cache-cold loop, every Python layer shows.
    ordered = history[:fill].copy()
    ordered.sort()
    less = ordered.searchsorted(values, "left")
    tie = ordered.take(np.minimum(less, fill - 1)) == values
    if not np.logical_or.reduce(tie):  # (2 * less * 0.5) is exactly less in float32
        np.divide(less.astype(np.float32), np.float32(fill), out=out)
        return
    twice = less + less
    twice[tie] += ordered.searchsorted(values[tie], "right") - less[tie]
    np.divide(twice.astype(np.float32) * np.float32(0.5), np.float32(fill), out=out)


class _Scratch:
    """Per-batch-size float32 buffers, each both a tensor and a NumPy view of its memory.

    The torch ops of the step (``pow``, the fixed mode's logs) run on them in place, so
    no tensor is wrapped or unwrapped per step: on a cache-cold CPU each such call into
    torch costs several microseconds.
    """

    def __init__(self, rows: int):
        self.pct_t = torch.empty(rows, dtype=torch.float32)
        self.p_t = torch.empty(rows, dtype=torch.float32)
        self.pct, self.p = self.pct_t.numpy(), self.p_t.numpy()
        self.u_t = torch.empty(rows, dtype=torch.float32)
        self.g_t = torch.empty(rows, dtype=torch.float32)
        self.u = self.u_t.numpy()
        self.kept = np.empty(rows, dtype=np.int64)


def _record_numpy(history: np.ndarray, pos: int, fill: int, values: np.ndarray) -> Tuple[int, int]:
    """``kernels.ring_buffer.ring_buffer_update``, in place: append ``values`` in order."""
    h = history.shape[0]
    n_write = values.shape[0]
    land = values[-h:]  # more values than slots: only the last h land
    start = (pos + n_write - land.shape[0]) % h
    head = min(land.shape[0], h - start)
    history[start : start + head] = land[:head]
    history[: land.shape[0] - head] = land[head:]
    return (pos + n_write) % h, min(fill + n_write, h)


@dataclass(eq=False)
class HostSiftState:
    """``SiftState`` held on the host: a NumPy history and Python ints, updated in place.

    The CPU step creates no tensors for the state; ``to_state()`` makes a ``SiftState``
    (copies) when one is asked for (checkpoints, metrics).
    """

    history: np.ndarray
    pos: int
    fill: int
    seed: int
    draws: int
    num_scored: int
    num_kept: int
    num_nonfinite: int
    scratch: Dict[int, _Scratch] = field(default_factory=dict, repr=False)
    # history[:fill] sorted, kept so by the C kernels (derived state: never checkpointed)
    ordered: Optional[np.ndarray] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if _host is not None and self.ordered is None:
            self.ordered = np.empty_like(self.history)
            _host.sort(self.history, self.fill, self.ordered)

    @classmethod
    def from_state(cls, state: SiftState) -> "HostSiftState":
        ints = {f.name: int(getattr(state, f.name)) for f in fields(SiftState) if f.name != "history"}
        history = np.ascontiguousarray(state.history.detach().to("cpu", torch.float32).numpy(), dtype=np.float32).copy()
        return cls(history=history, **ints)

    def to_state(self) -> SiftState:
        ints = {f.name: torch.tensor(getattr(self, f.name), dtype=torch.int64) for f in fields(SiftState) if f.name != "history"}
        return SiftState(history=torch.from_numpy(self.history.copy()), **ints)


@dataclass(eq=False)
class HostStepOutput:
    """``StepOutput`` on the host: the kept rows (source order), and the non-finite count."""

    kept: np.ndarray
    num_nonfinite: int


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """``t`` (no grad: the loader detaches losses) as a C-contiguous float32 array; no copy when it is one."""
    try:
        a = t.numpy()
    except (TypeError, RuntimeError):  # bfloat16 (no NumPy type), or a tensor that requires grad
        return t.detach().to(torch.float32).numpy()
    if a.dtype != np.float32:
        return t.to(torch.float32).numpy()
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def sift_step_cpu(
    state: HostSiftState,
    losses: torch.Tensor,
    n_valid: int,
    beta: torch.Tensor,
    mode: str,
    k: int,
    n_take: int,
    shared_losses: Optional[torch.Tensor] = None,
    shared_valid: Optional[torch.Tensor] = None,
) -> HostStepOutput:
    """``engine.step.sift_step`` on a ``HostSiftState`` (updated in place); rows ``[0, n_valid)`` are valid.

    ``losses`` has the padded length P (fixed mode draws among P rows, like the torch step).
    """
    p_rows = losses.shape[0]
    all_losses = _as_numpy(losses)
    scratch = state.scratch.get(p_rows)
    if scratch is None:
        scratch = state.scratch[p_rows] = _Scratch(p_rows)
    pct = scratch.pct  # all P rows; padding rows get 1.0
    fused = _host is not None and shared_losses is None  # rank and record in one call
    if fused:
        num_nonfinite, state.pos, state.fill = _host.rank_and_record(
            all_losses, n_valid, state.history, state.ordered, state.pos, state.fill, pct
        )
    elif _host is not None:
        num_nonfinite = _host.rank(all_losses, n_valid, state.ordered, state.fill, pct)
    else:
        valid = all_losses[:n_valid]
        finite = np.isfinite(valid)
        num_nonfinite = n_valid - int(np.count_nonzero(finite))
        _rank_numpy(np.where(finite, valid, np.float32(0.0)) if num_nonfinite else valid, state.history, state.fill, pct[:n_valid])
        pct[n_valid:] = 1.0
    if mode == "probabilistic":
        # Over all P rows, like the torch step: which elements ATen computes in its vector
        # loop and which in its scalar tail (slightly different pow) depends on the length.
        torch.pow(scratch.pct_t, beta, out=scratch.p_t)
        if _host is not None:
            count = _host.draw_keep(state.seed, state.draws, scratch.p, all_losses, n_valid, scratch.kept)
            kept = scratch.kept[:count].copy()
        else:
            u = uniforms_numpy(state.seed, state.draws, n_valid)
            keep = u < scratch.p[:n_valid]
            if num_nonfinite:
                keep |= ~np.isfinite(all_losses[:n_valid])
            kept = keep.nonzero()[0]
    elif mode == "fixed":
        if _host is not None:
            _host.uniforms(state.seed, state.draws, scratch.u)
        else:
            scratch.u[:] = uniforms_numpy(state.seed, state.draws, p_rows)
        # The torch step's beta * log(clamp(pct)) + -log(-log(u)), op for op, in place:
        # a * b == b * a and a + (-c) == a - c exactly, so the scores are identical.
        score, gumbel = scratch.p_t, scratch.g_t
        torch.clamp(scratch.pct_t, min=_MIN_PERCENTILE, out=score)
        torch.log(score, out=score)
        score.mul_(beta)
        torch.log(scratch.u_t, out=gumbel)
        torch.log(gumbel.neg_(), out=gumbel)
        torch.sub(score, gumbel, out=score)
        if num_nonfinite:
            scratch.p[:n_valid][~np.isfinite(all_losses[:n_valid])] = np.inf
        scratch.p[n_valid:] = -np.inf
        top = torch.topk(score, k, sorted=True).indices.numpy()
        kept = np.sort(top[: min(n_take, k)])
    else:
        raise ValueError(f"unknown selection mode {mode!r}")
    if not fused:
        if shared_losses is None:
            values, mask, n = all_losses, None, n_valid
        else:
            values, mask, n = _as_numpy(shared_losses), shared_valid.numpy(), shared_losses.shape[0]
        if _host is not None:
            state.pos, state.fill = _host.record(values, mask, n, state.history, state.ordered, state.pos, state.fill)
        else:
            keep_rows = np.isfinite(values[:n]) if mask is None else mask & np.isfinite(values[:n])
            state.pos, state.fill = _record_numpy(state.history, state.pos, state.fill, values[:n][keep_rows])
    state.draws += 1
    state.num_scored += n_valid
    state.num_kept += kept.shape[0]
    state.num_nonfinite += num_nonfinite
    return HostStepOutput(kept=kept, num_nonfinite=num_nonfinite)
