"""What a step of a suite task's model costs on the run's device: the cost terms of per-batch
sifting's cost model (``lm_model.cost_probe`` on the task's model, batch size and learning
rate, its first batches), measured once per task run on a throwaway model, before the first
arm, and kept in every record (``config["cost_probe"]``) so that the summary can predict
each arm's speedup from its sample counts (``report/summary.predicted_speedup``).
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.core.compiled import compile_model
from benchmarks.instruments.options import CLOCKS
from benchmarks.tasks.lm_model import cost_probe
from benchmarks.tasks.registry import Data, TaskConfig, make_model

BATCHES = 4  # per round


def classification_losses(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def probe_on_backend(
    make: Callable[[], torch.nn.Module], batches: list, lr: float, backend: dict[str, Any], clock: str, **kw: Any
) -> dict:
    """``cost_probe`` of ``make()``'s model on the backend's device, compiled where the backend
    compiles (the probe's untimed round compiles it), synchronised as the backend's runs are,
    on ``clock``; ``kw`` to ``cost_probe`` (``per_sample``)."""
    torch.manual_seed(0)
    return cost_probe(
        lambda: compile_model(make().to(backend["device"]), backend, lambda m: None),
        batches,
        backend["device"],
        lr,
        backend.get("wait"),
        sync=backend.get("sync"),
        clock=CLOCKS[clock],
        **kw,
    )


def task_cost_probe(task: TaskConfig, data: Data, backend: dict[str, Any], clock: str) -> dict:
    """The probe on ``task``'s model and its first ``BATCHES`` batches."""
    b = task.batch_size
    batches = [(data.x_train[i * b : (i + 1) * b], data.y_train[i * b : (i + 1) * b]) for i in range(BATCHES)]
    probe = probe_on_backend(
        lambda: make_model(task), batches, task.lr, backend, clock, per_sample=classification_losses
    )
    return {**probe, "clock": clock}


def describe_probe(probe: dict, device: str) -> str:
    """The line a task run prints before its first arm."""
    return (
        f"  step costs ({device}): backward+optimizer / forward {probe['backward_to_forward']:.2f}, "
        f"scoring forward / training step {probe['scoring_share_of_step']:.2f}, "
        f"training step {1000 * probe['train_step_s']:.1f} ms ({probe['clock']} clock)"
    )
