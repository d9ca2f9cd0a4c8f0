"""``sift_step`` for CPU tensors, on the host, in C: the same results as the torch step, bit for bit.

Why a second implementation of the step: on a CPU it runs once per source batch between
the DataLoader's and the training step's work, with cold caches, where every one of the
torch step's many small ops pays torch's per-op overhead and the history is sorted anew
each step. Here the state lives on the host (a NumPy history and Python ints, updated in
place), the valid rows are a prefix (sliced, not masked), and the ranking and the history
update are one call each into ``neuron_sift.kernels._host`` (C, neuron_sift/kernels/_host.c), which
keeps the history sorted across steps instead of sorting it. benchmarks/machinery.py
measures what that saves (its ``host`` and ``torch`` engines on the eager backend).

Why not a third: the extension is optional, so an install without a C compiler lacks it.
There the torch step runs on the CPU instead, which already gives the same selections;
``host_kernels_available()`` tells the engine (``sifter.py``) which of the two to run,
and a ``HostSiftState`` cannot be made without the kernels.

Bit-exact with ``engine.step.sift_step`` (tests/neuron_sift/engine/test_cpu_step.py):
the counts, the hash random numbers and the ring buffer are integer arithmetic; the
percentile is the same float32 division; the transcendental steps (``pct ** beta``, the
logs of the fixed mode's Gumbel draw) and ``topk`` (whose tie order decides between equal
scores) are computed by the very same torch ops on the same shapes.

Only for CPU tensors; the engine runs it where the backend's device is the CPU and the
extension was built, the torch step everywhere else (CUDA, XLA, and the CPU without the
extension).
"""

import importlib
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from neuron_sift.engine.state import SiftState

try:  # imported by name: the C extension has no type information (mypy reads it as Any)
    _host: Any = importlib.import_module("neuron_sift.kernels._host")
except ImportError:  # built without a C compiler: the torch step runs on the CPU instead
    _host = None
from neuron_sift.kernels.selection import _MIN_PERCENTILE


def host_kernels_available() -> bool:
    """Whether the C kernels (``neuron_sift.kernels._host``) were built, so the host step can run.

    Without them the CPU runs the torch step (``engine.step.sift_step``): the same
    selections, bit for bit.
    """
    return _host is not None


class _Scratch:
    """Per-batch-size float32 buffers, each both a tensor and a NumPy view of its memory.

    The torch ops of the step (``pow``, the fixed mode's logs) run on them in place, so
    no tensor is wrapped or unwrapped per step: on a cache-cold CPU every call into torch
    has a fixed cost that shows at this size.
    """

    def __init__(self, rows: int):
        self.pct_t = torch.empty(rows, dtype=torch.float32)
        self.p_t = torch.empty(rows, dtype=torch.float32)
        self.pct, self.p = self.pct_t.numpy(), self.p_t.numpy()
        self.u_t = torch.empty(rows, dtype=torch.float32)
        self.g_t = torch.empty(rows, dtype=torch.float32)
        self.u = self.u_t.numpy()
        self.kept = np.empty(rows, dtype=np.int64)


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
    scratch: dict[int, _Scratch] = field(default_factory=dict, repr=False)
    # history[:fill] sorted, kept so by the C kernels (derived state: never checkpointed)
    ordered: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if _host is None:
            raise RuntimeError(
                "HostSiftState needs the C kernels (neuron_sift.kernels._host), which were not built "
                "(no C compiler at install); run the torch step (engine.step.sift_step) on the CPU "
                "instead: check engine.cpu_step.host_kernels_available() first"
            )
        if self.ordered is None:
            self.ordered = np.empty_like(self.history)
            _host.sort(self.history, self.fill, self.ordered)

    @classmethod
    def from_state(cls, state: SiftState) -> "HostSiftState":
        # Any: mypy would match the ints against every keyword of cls, scratch and ordered included
        ints: dict[str, Any] = {f.name: int(getattr(state, f.name)) for f in fields(SiftState) if f.name != "history"}
        history = np.ascontiguousarray(state.history.detach().to("cpu", torch.float32).numpy(), dtype=np.float32).copy()
        return cls(history=history, **ints)

    def to_state(self) -> SiftState:
        ints = {
            f.name: torch.tensor(getattr(self, f.name), dtype=torch.int64)
            for f in fields(SiftState)
            if f.name != "history"
        }
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
    shared_losses: torch.Tensor | None = None,
    shared_valid: torch.Tensor | None = None,
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
    fused = shared_losses is None  # rank and record in one call
    if fused:
        num_nonfinite, state.pos, state.fill = _host.rank_and_record(
            all_losses, n_valid, state.history, state.ordered, state.pos, state.fill, pct
        )
    else:  # rank against this history, record every rank's losses below
        num_nonfinite = _host.rank(all_losses, n_valid, state.ordered, state.fill, pct)
    if mode == "probabilistic":
        # Over all P rows, like the torch step: which elements ATen computes in its vector
        # loop and which in its scalar tail (slightly different pow) depends on the length.
        torch.pow(scratch.pct_t, beta, out=scratch.p_t)
        count = _host.draw_keep(state.seed, state.draws, scratch.p, all_losses, n_valid, scratch.kept)
        kept = scratch.kept[:count].copy()
    elif mode == "fixed":
        _host.uniforms(state.seed, state.draws, scratch.u)
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
    elif mode == "topk":  # the torch step's top_k_indices on the same scores: the same tie order
        score = scratch.p_t
        np.copyto(scratch.p, all_losses)
        finite = np.isfinite(scratch.p)
        scratch.p[~finite] = 0.0
        if num_nonfinite:
            scratch.p[:n_valid][~finite[:n_valid]] = np.inf
        scratch.p[n_valid:] = -np.inf
        top = torch.topk(score, k, sorted=True).indices.numpy()
        kept = np.sort(top[: min(n_take, k)])
    else:
        raise ValueError(f"unknown selection mode {mode!r}")
    if shared_losses is not None:  # not fused
        if shared_valid is None:
            raise ValueError("sift_step_cpu: shared_losses needs shared_valid (the valid rows of every rank's losses)")
        values, mask, n = _as_numpy(shared_losses), shared_valid.numpy(), shared_losses.shape[0]
        state.pos, state.fill = _host.record(values, mask, n, state.history, state.ordered, state.pos, state.fill)
    state.draws += 1
    state.num_scored += n_valid
    state.num_kept += kept.shape[0]
    state.num_nonfinite += num_nonfinite
    return HostStepOutput(kept=kept, num_nonfinite=num_nonfinite)
