"""Runs the arms fairly: seeds, initial weights, data order, schedules, the clock, runs.jsonl.

Fairness, per seed: the same initial weights (built once, copied into every arm), the same
data order (``EpochOrder``: one permutation per seed and epoch, the same for every arm),
the same optimizer, and a cosine learning-rate schedule that decays to 0 at the end of the
arm's *own* run (``CosineSchedule``: over its planned steps, or epoch by epoch when each
epoch's length is known only when it is planned), after a linear warm-up over the task's
``warmup`` share of that same run (0 for most tasks). Wall-clock covers everything the
training loop waits for, scoring forwards and selection included; the clock is paused
while test accuracy is evaluated (``evals_per_epoch`` times per epoch of source data).
The arms of a seed run in a seeded random order, so a drift in the machine's speed does
not favour one arm systematically; an untimed warm-up of a throwaway model pays the
process's one-time costs before the first arm.
"""

import copy
import json
import math
import os
import platform
import random
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler, TensorDataset

import neuron_sift
from neuron_sift.metrics.sifting_metrics import xla_compile_count

from arms import get_arm
from report import annotate_seed
from tasks import Data, TaskConfig, make_model


class Clock:
    """Wall-clock with pause (evaluation is not training time), and beside it the process's
    CPU time over the same intervals (``cpu_total``): on a shared machine other processes
    stretch the wall-clock, not the CPU time of a one-thread eager run, which is what its
    wall-clock would be on an idle machine (``--clock cpu`` reports with it)."""

    def __init__(self, sync=None):
        self.total = 0.0
        self.cpu_total = 0.0
        self.start = None
        self.cpu_start = None
        self.sync = sync

    def resume(self):
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()

    def pause(self):
        if self.sync is not None:
            self.sync()  # wait for the device before reading the clock
        self.total += time.perf_counter() - self.start
        self.cpu_total += time.process_time() - self.cpu_start
        self.start = self.cpu_start = None


def cosine_factor(total_steps: int):
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

    def __init__(self, optimizer, total_steps: Optional[int] = None, epochs: Optional[int] = None,
                 warmup: float = 0.0):
        if not 0.0 <= warmup < 1.0:
            raise ValueError(f"warmup must be in [0, 1), got {warmup}")
        self.optimizer = optimizer
        self.base = [g["lr"] for g in optimizer.param_groups]
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

    def _set(self):
        f = self.factor()
        for g, base in zip(self.optimizer.param_groups, self.base):
            g["lr"] = base * f

    def begin_epoch(self, steps: int):
        if self.epochs is None:
            raise RuntimeError("begin_epoch() is for a schedule built with epochs=")
        self.epoch_start = self.progress if self.epoch_steps == 0 else self.epoch_start + 1.0 / self.epochs
        self.epoch_start = min(self.epoch_start, 1.0)
        self.progress = self.epoch_start
        self.epoch_steps, self.epoch_done = max(int(steps), 1), 0
        self.planned = (self.planned or 0) + int(steps)
        self._set()

    def step(self):
        if self.epochs is None:
            self.progress = (self.progress * self.total_steps + 1) / max(self.total_steps, 1)
        else:
            self.epoch_done += 1
            self.progress = self.epoch_start + min(self.epoch_done, self.epoch_steps) / (self.epoch_steps * self.epochs)
        self._set()


class EpochOrder(Sampler):
    """The seed's data order: epoch ``e`` (the ``e``-th iteration) is ``order(seed, e)``."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(1_000_003 * self.seed + epoch))

    def __iter__(self):
        order = self.order(self.epoch)
        self.epoch += 1
        return iter(order.tolist())

    def __len__(self):
        return self.n


class XlaCounters:
    """Compile count and host reads (torch_xla.debug.metrics), evaluation excluded."""

    def __init__(self):
        import torch_xla.debug.metrics as met

        self.met = met

    def snapshot(self):
        r = self.met.metric_data("TransferFromDeviceTime")
        return xla_compile_count(), (r[0] if r else 0)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device, chunk: int = 2048) -> float:
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
    """What an arm gets (see arms.py for the interface)."""

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
    sync: Optional[Callable] = None
    counters: Optional[XlaCounters] = None
    progress: object = None
    curve: List[dict] = field(default_factory=list)
    steps: int = 0
    trained_samples: int = 0
    seen: int = 0
    epochs_run: int = 0
    schedule: Optional[CosineSchedule] = None
    mislabeled: int = 0
    mislabeled_per_epoch: List[float] = field(default_factory=list)
    _epoch_trained: int = 0
    _epoch_mislabeled: int = 0
    _next_eval: float = 0.0
    _snap: Optional[list] = None
    compiles: int = 0
    reads: int = 0

    def to_device(self, *tensors):
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
        running = self.clock.start is not None
        if running:
            self.clock.pause()
        if self.counters and self._snap is not None:
            c, r = self.counters.snapshot()
            self.compiles += c - self._snap[0]
            self.reads += r - self._snap[1]
        acc = evaluate(self.model, self.data.x_test, self.data.y_test, self.device)
        self.curve.append({"wall_s": round(self.clock.total, 4), "cpu_s": round(self.clock.cpu_total, 4),
                           "source_samples": self.seen, "steps": self.steps, "test_acc": acc})
        if self.counters:
            self._snap = list(self.counters.snapshot())
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


def run_arm(name: str, task: TaskConfig, data: Data, seed: int, init_state: dict, opts, backend: dict) -> dict:
    """One arm, one seed: the arm's training, timed, and its results (without the pairing)."""
    device = backend["device"]
    torch.manual_seed(seed)
    model = make_model(task)
    model.load_state_dict(init_state)  # same initial weights in every arm
    model.to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=task.lr, weight_decay=task.weight_decay)
    n = data.x_train.shape[0]
    dataset = TensorDataset(data.x_train, data.y_train, torch.arange(n))
    order = EpochOrder(n, seed)
    source = DataLoader(dataset, batch_size=task.batch_size, sampler=order)
    progress = None
    if opts.progress:
        from tqdm import tqdm

        progress = tqdm(total=None, desc=f"{task.name} seed {seed} {name}", leave=False, dynamic_ncols=True)
    ctx = ArmContext(task=task, data=data, seed=seed, device=device, epochs=task.epochs, beta=opts.beta, model=model,
                     optimizer=optimizer, dataset=dataset, source=source, order=order.order,
                     clock=Clock(backend.get("wait")), evals_per_epoch=opts.evals_per_epoch, sync=backend.get("sync"),
                     counters=XlaCounters() if backend["name"] == "xla" else None, progress=progress)
    ctx._next_eval = n / opts.evals_per_epoch
    ctx.evaluate()  # the starting point, at 0 s
    ctx.clock.resume()
    extra = get_arm(name).fn(ctx) or {}
    if len(ctx.curve) > 1 and ctx.curve[-1]["steps"] == ctx.steps:
        ctx.curve.pop()  # evaluated at the last step already: measured again below, at the final clock
    ctx.evaluate(resume=False)  # final: the clock stays stopped
    if progress:
        progress.close()
    seen = ctx.epochs_run * n
    kept = extra.pop("samples_kept", ctx.trained_samples)
    scoring = extra.pop("scoring_forward_samples", 0)
    planned = extra.pop("planned_steps", ctx.schedule.planned if ctx.schedule else ctx.steps)
    result = {
        "final_test_acc": ctx.curve[-1]["test_acc"],
        "wall_s": round(ctx.clock.total, 4),
        "cpu_s": round(ctx.clock.cpu_total, 4),
        "epochs": ctx.epochs_run,
        "steps": ctx.steps,
        "planned_steps": planned,
        "lr_at_end": optimizer.param_groups[0]["lr"],
        "source_samples_seen": seen,
        "samples_kept": kept,
        "kept_share": round(kept / max(task.epochs * n, 1), 4),
        "scoring_forward_samples": scoring,
        "training_forward_samples": ctx.trained_samples,
        "forward_samples": scoring + ctx.trained_samples,
        "backward_samples": ctx.trained_samples,
        "curve": ctx.curve,
        **extra,
    }
    if task.label_noise:
        result["mislabeled_share_trained"] = round(ctx.mislabeled / max(ctx.trained_samples, 1), 4)
        result["mislabeled_share_trained_per_epoch"] = ctx.mislabeled_per_epoch
        result["mislabeled_share_data"] = round(float(data.mislabeled.float().mean()), 4)
    if ctx.counters:
        result["xla_compiles"] = ctx.compiles
        result["xla_host_reads"] = ctx.reads
        result["xla_host_reads_per_step"] = round(ctx.reads / max(ctx.steps, 1), 3)
    return result


def warm_up(task: TaskConfig, data: Data, device, steps: int = 20) -> None:
    """Untimed: a throwaway model trains a few steps (allocator, kernels, lazy imports)."""
    model = make_model(task).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=task.lr)
    for i in range(steps):
        j = (i * task.batch_size) % max(data.x_train.shape[0] - task.batch_size, 1)
        x = data.x_train[j : j + task.batch_size].to(device)
        y = data.y_train[j : j + task.batch_size].to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    evaluate(model, data.x_test, data.y_test, device)


def run_task(task: TaskConfig, data: Data, arms: List[str], opts, backend: dict, vers: dict, config: dict,
             json_path: Path) -> List[dict]:
    """Every seed, every arm (in a seeded random order), paired by seed; appends runs.jsonl."""
    records = []
    warm_up(task, data, backend["device"])
    for seed in opts.seeds:
        torch.manual_seed(seed)
        init_state = copy.deepcopy(make_model(task).state_dict())
        run_order = list(arms)
        random.Random(seed).shuffle(run_order)
        results = {}
        for arm in run_order:
            r = run_arm(arm, task, data, seed, init_state, opts, backend)
            results[arm] = r
            print(f"  seed {seed} {arm:<18} acc {r['final_test_acc']:.2%}  wall {r['wall_s']:.1f} s  cpu {r['cpu_s']:.1f} s  "
                  f"steps {r['steps']}/{r['planned_steps']}  kept {r['kept_share']:.3f}", flush=True)
        annotate_seed(results, opts.target_drop, opts.clock)  # target, time to target, the paired numbers
        for arm in arms:
            line = {
                "task": task.name,
                "arm": arm,
                "seed": seed,
                "backend": backend["name"],
                "device": backend["device_desc"],
                "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "versions": vers,
                "config": config,
                "results": results[arm],
            }
            records.append(line)
            with open(json_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
    return records


def setup_backend(name: str) -> dict:
    if name == "eager":
        return {"name": "eager", "device": torch.device("cpu"), "device_desc": f"cpu ({platform.processor() or platform.machine()})"}
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    device = torch_xla.device()  # before the first backward of the process (see README)
    return {
        "name": "xla",
        "device": device,
        "device_desc": f"xla:{xr.device_type()}",
        "sync": torch_xla.sync,
        "wait": xm.wait_device_ops,
        "torch_xla": torch_xla.__version__,
    }


def git_commit() -> Optional[str]:
    """HEAD's hash, '+dirty' when benchmarks/ or neuron_sift/ differ from it; None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "benchmarks", "neuron_sift"], cwd=root,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions(backend: dict) -> dict:
    v = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "neuron_sift": neuron_sift.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "commit": git_commit(),
    }
    if "torch_xla" in backend:
        v["torch_xla"] = backend["torch_xla"]
    return v
