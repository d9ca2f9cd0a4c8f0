"""The model under ``torch.compile`` for one arm's run (the ``compiled`` and ``cuda-compiled``
backends): its training forward and backward, its scoring forwards and its evaluation. The
sifting loaders' own step stays as the loader chooses (eager on a GPU), as in a user's
script that compiles its model.

Each arm's warm-up calls every graph its run will, before its clock starts, so compilation
is no arm's training time: the first arm compiles them, and later arms' models (the same
class; Dynamo takes a module's parameters as graph inputs) reuse them. ``graphs_compiled``
counts the graphs Dynamo builds, so each run records how many it compiled while its clock
ran (a shape the warm-up missed shows there, not as a slow arm).
"""

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn as nn


def compile_model(model: nn.Module, backend: dict[str, Any], warm_up: Callable[[nn.Module], None]) -> nn.Module:
    """``model`` itself on an uncompiled backend; else ``torch.compile(model)`` (the backend's
    ``compile_backend``) after ``warm_up`` has called every graph the run will (its
    gradients dropped: the weights stay as they were)."""
    if not backend.get("compile"):
        return model
    compiled = cast(nn.Module, torch.compile(model, backend=backend["compile_backend"]))
    warm_up(compiled)
    model.zero_grad(set_to_none=True)
    return compiled


def graphs_compiled() -> int:
    """The graphs Dynamo has compiled in this process (a count that only grows)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def count_compiles(backend: dict[str, Any], run: Callable[[], dict | None]) -> dict:
    """``run()``'s result (an arm's own keys), with ``graphs_compiled_in_run`` on a compiled
    backend: the graphs compiled while it ran, which a complete warm-up keeps at 0."""
    before = graphs_compiled()
    extra = run() or {}
    if backend.get("compile"):
        extra["graphs_compiled_in_run"] = graphs_compiled() - before
    return extra
