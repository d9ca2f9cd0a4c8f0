"""The selection step traced once on torch-xla: one lazy-graph node per source batch.

Why: torch-xla traces every op of a lazy graph anew on each call, and the step is about
80 ops, so per source batch the host spent more time tracing the step than the device
spent running it. torch-xla 2.9 ships ``torch_xla.experimental.assume_pure.assume_pure_torch``
(the JAX-free form of ``assume_pure``; ``assume_pure`` itself needs JAX): it traces a
function once on placeholder tensors, lowers it to an XLA computation, and each later
call inserts that computation as one node of the surrounding lazy graph, where it fuses
with the rest. The graph the device runs is the same computation, so results are the
same bit for bit.

What the 2.9 implementation implies, and how the engine meets it (read in its source):
- its cache is keyed by the function's ``__name__`` alone, global to the process, and
  trusts the caller to keep shapes fixed: here every (mode, k, global history, step
  functions, input shapes and dtypes) gets its own function with a process-unique name,
  shared by every loader of the process (so a second loader adds no graph);
- tensors created inside the function become constants captured at trace time (it
  "hoists" them), so everything that changes between calls must be an input: the state,
  the losses, the per-batch vector, beta, the seed's hash key. The step's randomness is
  the counter hash of ``neuron_sift/kernels/random.py`` on the (seed key, draws) inputs; no torch RNG
  op runs inside (those would be frozen at their trace-time seed);
- it asserts that autograd is off when the function is wrapped; the step runs under
  ``torch.no_grad()``;
- it is forward only: the step needs no gradients;
- an output used directly as the index of ``index_select`` crashes 2.9 (see ``run``).

Where the function is missing (an older torch-xla, or a build without it) the step is
traced per call, as before, and one log line says so.
"""

import itertools
import logging
from collections.abc import Callable, Hashable

import torch

logger = logging.getLogger(__name__)

_names = itertools.count()
_warned = False


def unique_name(prefix: str) -> str:
    """A name no other traced-once function of this process has (``assume_pure_torch``
    caches computations by name, process-wide)."""
    return f"{prefix}_{next(_names)}"


def assume_pure_torch() -> Callable | None:
    """torch-xla's ``assume_pure_torch``, or None (logged once) where this torch-xla lacks it."""
    global _warned
    try:
        from torch_xla.experimental.assume_pure import assume_pure_torch as fn
    except ImportError as exc:
        if not _warned:
            _warned = True
            logger.warning(
                "neuron_sift: torch_xla.experimental.assume_pure.assume_pure_torch is not available (%s); the "
                "selection step is traced anew for every source batch (slower on the host, same results)",
                exc,
            )
        return None
    return fn


# Process-wide: (key, input shapes and dtypes) -> the traced-once function. Shared by
# every loader in the process: a new computation (a new name) per loader would make every
# graph that contains the step new to torch-xla's graph cache, and compile again.
_PURE: dict[Hashable, Callable] = {}


def built() -> int:
    """Traced-once computations built in this process (tests check it stays flat)."""
    return len(_PURE)


class PureStepCache:
    """The traced-once computation for each (key, input shapes and dtypes) a backend runs.

    ``key`` must name everything the traced function depends on besides its inputs (the
    engine passes mode, k, global history, and the step and percentile functions).
    """

    def __init__(self) -> None:
        self.signatures: set[Hashable] = set()  # the signatures this backend ran

    def run(self, key: Hashable, fn: Callable, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        """``fn(*inputs)`` through the traced computation; None where assume_pure_torch is missing."""
        signature = (key, tuple((tuple(t.shape), t.dtype) for t in inputs))
        pure = _PURE.get(signature)
        if pure is None:
            wrap = assume_pure_torch()
            if wrap is None:
                return None

            def step(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
                return fn(*tensors)

            # Its cache is keyed by this name: unique in the process, one per signature.
            step.__name__ = unique_name(f"neuron_sift_{getattr(fn, '__name__', 'step')}")
            with torch.no_grad():
                pure = _PURE[signature] = wrap(step, use_cache=True)
        self.signatures.add(signature)
        with torch.no_grad():
            outputs = pure(*inputs)
            # torch-xla 2.9 aborts the process (xla/shape.h "Check failed: buffer != nullptr")
            # when index_select takes its index straight from a user computation's output;
            # one elementwise op in between avoids it. Index-like outputs (integer, not
            # 0-dim: the step's ``order``) get one, as any consumer may gather with them.
            return tuple(t + 0 if t.dim() > 0 and not t.dtype.is_floating_point else t for t in outputs)
