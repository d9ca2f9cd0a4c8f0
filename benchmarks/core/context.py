"""What an arm gets: the ``ArmContext`` (the interface is in ``arms/registry.py``'s
docstring) and the test-accuracy evaluation it pauses the clock for.

Its own module, below the arms and the runner alike: every arm takes a context and the
runner builds one, so neither has to import the other for it (the runner is handed the
arms by the suite; the arms never reach back up into the runner).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.core.fairness import CosineSchedule
from benchmarks.instruments.clock import Clock, XlaCounters
from benchmarks.tasks.registry import Data, TaskConfig


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, chunk: int = 2048) -> float:
    was = model.training
    model.eval()
    correct = 0
    for i in range(0, x.shape[0], chunk):
        xb = x[i : i + chunk].to(device)
        correct += int((model(xb).argmax(dim=1).cpu() == y[i : i + chunk]).sum())
    model.train(was)
    return correct / x.shape[0]


@dataclass
class ArmContext:
    """What an arm gets (see ``arms/registry.py`` for the interface)."""

    task: TaskConfig
    data: Data
    seed: int
    device: torch.device
    epochs: int
    beta: float
    model: nn.Module
    optimizer: torch.optim.Optimizer
    dataset: TensorDataset
    source: DataLoader
    order: Callable[[int], torch.Tensor]
    clock: Clock
    evals_per_epoch: int
    sync: Callable[[], None] | None = None
    counters: XlaCounters | None = None
    progress: Any = None
    curve: list[dict] = field(default_factory=list)
    steps: int = 0
    trained_samples: int = 0
    seen: int = 0
    epochs_run: int = 0
    schedule: CosineSchedule | None = None
    mislabeled: int = 0
    mislabeled_per_epoch: list[float] = field(default_factory=list)
    _epoch_trained: int = 0
    _epoch_mislabeled: int = 0
    _next_eval: float = 0.0

    def to_device(self, *tensors: torch.Tensor) -> tuple:
        return tuple(t.to(self.device) for t in tensors)

    def step_schedule(self, total_steps: int) -> CosineSchedule:
        self.schedule = CosineSchedule(self.optimizer, total_steps=int(total_steps), warmup=self.task.warmup)
        if self.progress is not None:
            self.progress.total = int(total_steps)
        return self.schedule

    def epoch_schedule(self, epochs: int) -> CosineSchedule:
        self.schedule = CosineSchedule(self.optimizer, epochs=int(epochs), warmup=self.task.warmup)
        return self.schedule

    def evaluate(self, resume: bool = True) -> float:
        """Test accuracy now, the clock paused; appends a point to the curve."""
        running = self.clock.running
        if running:
            self.clock.pause()
        if self.counters:
            self.counters.add_since()
        acc = evaluate(self.model, self.data.x_test, self.data.y_test, self.device)
        self.curve.append(
            {
                "wall_s": round(self.clock.total, 4),
                "cpu_s": round(self.clock.cpu_total, 4),
                "source_samples": self.seen,
                "steps": self.steps,
                "test_acc": acc,
            }
        )
        if self.counters:
            self.counters.mark()
        if running and resume:
            self.clock.resume()
        return acc

    def trained(self, ids: torch.Tensor, seen: int) -> None:
        """After every optimizer step: ``ids`` the step's sample indices, ``seen`` the source
        samples passed over so far (trained or skipped). Evaluates at each 1/evals_per_epoch
        epoch of ``seen``."""
        if self.sync:
            self.sync()
        b = int(ids.shape[0])
        self.steps += 1
        self.trained_samples += b
        self._epoch_trained += b
        if self.task.label_noise:
            self._epoch_mislabeled += int(self.data.mislabeled[ids.cpu()].sum())
        self.seen = int(seen)
        if self.progress is not None:
            self.progress.update(1)
        n = len(self.dataset)
        while self.seen >= self._next_eval - 1e-9:
            self._next_eval += n / self.evals_per_epoch
            self.evaluate()

    def end_epoch(self) -> None:
        self.epochs_run += 1
        self.mislabeled += self._epoch_mislabeled
        if self.task.label_noise:
            self.mislabeled_per_epoch.append(round(self._epoch_mislabeled / max(self._epoch_trained, 1), 4))
        self._epoch_trained = self._epoch_mislabeled = 0
