"""What every arm of a seed shares besides its initial weights: the data order and the
shape of the learning-rate schedule.

* ``EpochOrder``: one permutation per seed and epoch, the same for every arm;
* ``CosineSchedule``: a cosine decay to 0 at the end of the arm's *own* run (over its
  planned steps, or epoch by epoch when each epoch's length is known only when it is
  planned), after a linear warm-up over the task's ``warmup`` share of that same run.
"""

import math
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import Sampler


def cosine_factor(total_steps: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))

    return f


class CosineSchedule:
    """lr = base_lr * cosine_factor, by steps (``total_steps``) or epoch by epoch.

    By steps: ``step()`` advances ``1 / total_steps``; clamped at the end. Epoch by epoch
    (``epochs`` given): call ``begin_epoch(steps)`` when the epoch's length is known; each
    ``step()`` then advances ``1 / (epochs * steps)``, so the schedule ends at 0 after the
    last epoch whatever each epoch's length.

    ``warmup`` (a share of the run, 0 to < 1): the factor rises linearly from 0 to 1 over
    that first share of the progress, then the cosine decays from 1 to 0 over the rest. It
    is a share of the arm's own run, like the decay, so every arm warms up alike.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int | None = None,
        epochs: int | None = None,
        warmup: float = 0.0,
    ):
        if not 0.0 <= warmup < 1.0:
            raise ValueError(f"warmup must be in [0, 1), got {warmup}")
        if (total_steps is None) == (epochs is None):
            raise ValueError("CosineSchedule runs by steps (total_steps=) or epoch by epoch (epochs=): give one")
        self.optimizer = optimizer
        self.base: list[float] = [g["lr"] for g in optimizer.param_groups]
        self.total_steps, self.epochs = total_steps, epochs
        self.warmup = float(warmup)
        self.progress = 0.0
        self.epoch_start = 0.0
        self.epoch_steps = 0
        self.epoch_done = 0
        self.planned = total_steps
        self._set()

    def factor(self) -> float:
        p = min(max(self.progress, 0.0), 1.0)
        if p < self.warmup:
            return p / self.warmup
        return 0.5 * (1.0 + math.cos(math.pi * (p - self.warmup) / (1.0 - self.warmup)))

    def _set(self) -> None:
        f = self.factor()
        for g, base in zip(self.optimizer.param_groups, self.base, strict=True):
            g["lr"] = base * f

    def begin_epoch(self, steps: int) -> None:
        if self.epochs is None:
            raise RuntimeError("begin_epoch() is for a schedule built with epochs=")
        self.epoch_start = self.progress if self.epoch_steps == 0 else self.epoch_start + 1.0 / self.epochs
        self.epoch_start = min(self.epoch_start, 1.0)
        self.progress = self.epoch_start
        self.epoch_steps, self.epoch_done = max(int(steps), 1), 0
        self.planned = (self.planned or 0) + int(steps)
        self._set()

    def step(self) -> None:
        if self.total_steps is not None:
            self.progress = (self.progress * self.total_steps + 1) / max(self.total_steps, 1)
        elif self.epochs is not None:
            self.epoch_done += 1
            self.progress = self.epoch_start + min(self.epoch_done, self.epoch_steps) / (self.epoch_steps * self.epochs)
        self._set()


class EpochOrder(Sampler):
    """The seed's data order: epoch ``e`` (the ``e``-th iteration) is ``order(seed, e)``."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(1_000_003 * self.seed + epoch))

    def __iter__(self) -> Iterator[int]:
        order = self.order(self.epoch)
        self.epoch += 1
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.n
