"""What an arm of the single-pass language-model task gets: its configuration (``LMConfig``),
the ``LMContext`` (model, optimizer, the seed's stream of training windows, the clock, the
held-out evaluation) and the per-part stopwatch of the cost accounting (``PartTimes``).

Single pass, compute-limited, as in pretraining: every arm takes the same number of
optimizer steps (``LMConfig.steps``, the budget; a frontier run ``full@X`` takes X of it),
each reading the seed's stream of windows from its start; an arm that skips samples reads
further into the stream for the same steps. Nothing is read twice, and the stream is longer
than any arm reads (an arm that would run out of it is an error, not a second epoch).
"""

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.core.fairness import CosineSchedule
from benchmarks.instruments.clock import Clock
from benchmarks.tasks.lm_corpus import Corpus
from benchmarks.tasks.lm_model import LMShape, heldout_bpb, sequence_losses

PARTS = ("train_step", "scoring", "machinery")  # timed inside a run; the rest of its time is the data path


@dataclass(frozen=True)
class LMConfig:
    """The task's settings. ``tolerance`` (bits per byte): the target is ``full``'s final
    held-out loss plus it; ``reference_steps``: the reference model's training steps
    (``lm_reference.py``)."""

    steps: int = 200
    batch_size: int = 32
    lr: float = 2e-3
    warmup: float = 0.05
    shape: LMShape = field(default_factory=LMShape)
    evals: int = 16
    heldout_sequences: int = 256
    tolerance: float = 0.02
    sift_delay: int = 8
    history: int = 1024
    sb_keep: float = 0.5
    sb_start: float = 0.5
    sb_end: float = 0.9
    sb_interrupt: int = 2
    reference_steps: int = 100

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "evals", "heldout_sequences", "history", "reference_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"LMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.sift_delay < 0 or self.sb_interrupt < 0:
            raise ValueError("LMConfig.sift_delay and sb_interrupt must be >= 0")
        if self.lr <= 0 or self.tolerance < 0:
            raise ValueError("LMConfig.lr must be > 0 and tolerance >= 0")
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"LMConfig.warmup must be in [0, 1), got {self.warmup}")
        if not 0.0 < self.sb_keep <= 1.0 or not 0.0 <= self.sb_start <= self.sb_end <= 1.0:
            raise ValueError("LMConfig: sb_keep in (0, 1], 0 <= sb_start <= sb_end <= 1")

    @property
    def eval_every(self) -> int:
        return max(1, math.ceil(self.steps / self.evals))


def keep_count(keep: float, n: int) -> int:
    """SelectiveBackprop's batch: ``keep * n`` rounded down, at least 1 (``arms/selective_backprop.py``)."""
    if not 0.0 < keep <= 1.0 or n < 1:
        raise ValueError(f"keep must be in (0, 1] and n >= 1, got keep={keep}, n={n}")
    return max(1, math.floor(round(keep * n, 9)))


class PartTimes:
    """Seconds per part of a run (``parts``, by default ``PARTS``), on the wall and CPU
    clocks; ``wait`` (the device's synchronisation) runs before every reading, so a part
    owns its device work. Parts of one instance must not nest (their sum is a share of the
    run); a second instance can time an enclosing span (the sifting arm's loader)."""

    def __init__(self, wait: Callable[[], None] | None = None, parts: tuple[str, ...] = PARTS):
        self.wait = wait
        self.wall = dict.fromkeys(parts, 0.0)
        self.cpu = dict.fromkeys(parts, 0.0)

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        if part not in self.wall:
            raise KeyError(f"unknown part {part!r}; the parts are {tuple(self.wall)}")
        if self.wait:
            self.wait()
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            if self.wait:
                self.wait()
            self.wall[part] += time.perf_counter() - w0
            self.cpu[part] += time.process_time() - c0

    def timing(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, each call timed as ``part``."""

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            with self.timed(part):
                return fn(*args, **kwargs)

        return timed_call

    def add(self, part: str, wall: float, cpu: float) -> None:
        """Seconds measured elsewhere (the sifting arm's machinery: its loader's time less
        the scoring and the source's), on each clock."""
        if part not in self.wall:
            raise KeyError(f"unknown part {part!r}; the parts are {tuple(self.wall)}")
        self.wall[part] += wall
        self.cpu[part] += cpu


@dataclass
class LMContext:
    """What an LM arm gets: ``train_step(seq, ids, seen)`` per optimizer step, ``source``
    (the seed's stream of ``(window, index)`` batches), ``schedule(fraction)``, ``parts``."""

    config: LMConfig
    corpus: Corpus
    seed: int
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    source: DataLoader
    clock: Clock
    parts: PartTimes
    sync: Callable[[], None] | None = None
    progress: Any = None
    sched: CosineSchedule | None = None
    curve: list[dict] = field(default_factory=list)
    steps: int = 0
    planned: int = 0
    trained_samples: int = 0
    scoring_samples: int = 0
    seen: int = 0

    def schedule(self, fraction: float = 1.0) -> int:
        """The arm's step budget (``fraction`` of the task's, at least 1) and its cosine
        schedule, warmed up and decayed over that budget."""
        self.planned = max(1, math.ceil(round(fraction * self.config.steps, 9)))
        self.sched = CosineSchedule(self.optimizer, total_steps=self.planned, warmup=self.config.warmup)
        if self.progress is not None:
            self.progress.total = self.planned
        return self.planned

    @property
    def done(self) -> bool:
        return self.steps >= self.planned

    def losses(self, seq: torch.Tensor) -> torch.Tensor:
        return sequence_losses(self.model, seq)

    def train_step(self, seq: torch.Tensor, seen: int) -> None:
        """One optimizer step on ``seq`` (mean of the per-sample losses), timed as
        ``train_step``; ``seen``: source windows read so far. Evaluates every
        ``eval_every`` steps (clock paused)."""
        if self.sched is None:
            raise RuntimeError("call ctx.schedule() before the first train_step")
        with self.parts.timed("train_step"):
            seq = seq.to(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            self.losses(seq).mean().backward()
            self.optimizer.step()
            self.sched.step()
            if self.sync:
                self.sync()
        self.steps += 1
        self.trained_samples += int(seq.shape[0])
        self.seen = int(seen)
        if self.seen > self.corpus.train.shape[0]:
            raise RuntimeError("the stream ran out: the corpus is too small for this budget")
        if self.progress is not None:
            self.progress.update(1)
        if self.steps % self.config.eval_every == 0 and not self.done:
            self.evaluate()

    def evaluate(self, resume: bool = True) -> float:
        """Held-out bits per byte now, the clock paused; appends a point to the curve."""
        running = self.clock.running
        if running:
            self.clock.pause()
        bpb = heldout_bpb(self.model, self.corpus.heldout, self.device)
        self.curve.append(
            {
                "wall_s": round(self.clock.total, 4),
                "cpu_s": round(self.clock.cpu_total, 4),
                "steps": self.steps,
                "source_samples": self.seen,
                "trained_samples": self.trained_samples,
                "heldout_bpb": round(bpb, 5),
            }
        )
        if running and resume:
            self.clock.resume()
        return bpb


def stream_loader(corpus: Corpus, order: torch.Tensor, batch_size: int) -> DataLoader:
    """The seed's stream: batches of ``(window, index)`` in ``order``, the same for every arm."""
    dataset = TensorDataset(corpus.train, torch.arange(corpus.train.shape[0]))
    return DataLoader(dataset, batch_size=batch_size, sampler=order.tolist())
