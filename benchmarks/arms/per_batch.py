"""The arms of the library's per-batch mode and their control: ``sift-probabilistic`` and
``sift-fixed`` train through ``SiftingDataloader`` (the smart_sifting mode, one scoring
forward per source batch), ``uniform`` keeps a uniform random subset of every source batch
at the same kept share with no scoring at all.

Why ``uniform`` beside them: it is the cheapest way to train on the share the sifting arms
keep, with the same delay, carry and plan; a sifting arm that does not beat it got nothing
from its losses.
"""

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from benchmarks.core.context import ArmContext
from benchmarks.core.loops import train_plain
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.integrations.schedules import planned_steps
from neuron_sift.loss.abstract_sift_loss_module import Loss
from neuron_sift.sift_config.sift_configs import LossConfig, RelativeProbabilisticSiftConfig, SiftingBaseConfig

# the sifting loss: the sifting arms', and that of the planner of the uniform arm


class PerSampleCrossEntropy(Loss):
    """The sifting loss: the training loss, one value per sample."""

    def loss(self, model: torch.nn.Module, transformed_batch: Any, original_batch: Any = None) -> torch.Tensor:
        x, y, _ = original_batch
        return F.cross_entropy(model(x), y, reduction="none")


# uniform: a random subset of the sifting arms' kept share, no scoring


class UniformSubsetLoader:
    """Keeps a uniform random ``k = round(n / (1 + beta))`` rows of every source batch (after
    ``sift_delay`` source batches passed through whole) and yields full batches of B; kept
    rows left at the end of an epoch are carried into the next, as the sifting loader does.
    No scoring forward: the cheapest way to train on the same share of the data.

    Per source batch it keeps what ``SiftingDataloader(selection_mode="fixed")`` keeps (the
    config's ``fixed_keep_count``), with the same delay and the same carry, so it emits the
    same number of batches per epoch: its plan is that loader's, from the library's planner
    (``planned_steps``)."""

    def __init__(self, source: DataLoader, beta: float, sift_delay: int, seed: int):
        if source.batch_size is None:
            raise ValueError("UniformSubsetLoader batches as its source does: a DataLoader with a batch_size")
        self.source = source
        self.b: int = source.batch_size
        self.rule = RelativeProbabilisticSiftConfig(
            beta_value=beta,
            loss_history_length=1,
            loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=sift_delay)),
            selection_mode="fixed",
            seed=seed,
        )
        self.sift_delay = sift_delay
        self.g = torch.Generator().manual_seed(seed + 12345)
        self.delay_progress = 0
        self.pending: list[tuple] = []
        self.n_pending = 0
        self.seen = 0
        self.kept = 0

    def keep_count(self, n: int) -> int:
        return self.rule.fixed_keep_count(n)

    def planned_steps(self, epochs: int) -> int:
        """Exact: the batches the first ``epochs`` epochs emit (planned before the first): the
        plan of a fixed-mode ``SiftingDataloader`` with this loader's rule over the same
        source, which is only planned, never iterated (its model, a module without
        parameters, keeps it on the CPU whatever the run's device)."""
        if self.seen:
            raise RuntimeError("UniformSubsetLoader plans from its first epoch: call planned_steps() before iterating")
        twin = SiftingDataloader(
            sift_config=self.rule,
            orig_dataloader=self.source,
            loss_impl=PerSampleCrossEntropy(),
            model=torch.nn.Module(),
        )
        return planned_steps(twin, epochs)

    def __iter__(self) -> Iterator[list]:
        for batch in self.source:
            n = batch[0].shape[0]
            self.seen += n
            if self.delay_progress < self.sift_delay:
                self.delay_progress += 1
                self.kept += n
                yield batch
                continue
            k = self.keep_count(n)
            rows = torch.sort(torch.randperm(n, generator=self.g)[:k]).values
            self.pending.append(tuple(t[rows] for t in batch))
            self.n_pending += k
            self.kept += k
            while self.n_pending >= self.b:
                cat = [torch.cat(parts) for parts in zip(*self.pending, strict=True)]
                out = [t[: self.b] for t in cat]
                rest = tuple(t[self.b :] for t in cat)
                self.n_pending -= self.b
                self.pending = [rest] if self.n_pending else []
                yield out


def uniform(ctx: ArmContext) -> dict:
    loader = UniformSubsetLoader(ctx.source, ctx.beta, ctx.task.sift_delay, ctx.seed)
    sched = ctx.step_schedule(loader.planned_steps(ctx.epochs))
    train_plain(ctx, loader, ctx.epochs, sched, seen_of=lambda: loader.seen)
    return {"samples_kept": loader.kept}


# sift-probabilistic, sift-fixed: neuron_sift's SiftingDataloader (the smart_sifting mode)


def _sift_arm(mode: str) -> Callable[[ArmContext], dict]:
    def sift(ctx: ArmContext) -> dict:
        config = RelativeProbabilisticSiftConfig(
            beta_value=ctx.beta,
            loss_history_length=ctx.task.history,
            loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=ctx.task.sift_delay)),
            selection_mode=mode,
            seed=ctx.seed,
        )
        loader = SiftingDataloader(
            sift_config=config, orig_dataloader=ctx.source, loss_impl=PerSampleCrossEntropy(), model=ctx.model
        )
        sched = ctx.step_schedule(planned_steps(loader, ctx.epochs))
        train_plain(ctx, loader, ctx.epochs, sched, seen_of=lambda: loader.counts.num_orig_samples_seen)
        m = loader.metrics()
        seen = ctx.epochs * len(ctx.dataset)
        if m["num_orig_samples_seen"] != seen:
            raise RuntimeError(f"sift-{mode}: the loader saw {m['num_orig_samples_seen']} samples, expected {seen}")
        return {
            "samples_kept": m["num_orig_samples_kept"],
            "scoring_forward_samples": m["device_num_scored"],
            "machinery_s": round(m["machinery_seconds"], 4),
            "scoring_forward_s": round(m["timings"].get("calculate_relevance_values", {}).get("seconds", 0.0), 4),
            "samples_pending_at_end": m["num_samples_pending"],
            "source_batches_delayed": m["num_source_batches_delayed"],
        }

    sift.__doc__ = f"SiftingDataloader, selection_mode={mode!r}."
    return sift


def register_arms(register: Callable[..., Callable]) -> None:
    """``uniform``, ``sift-probabilistic`` and ``sift-fixed``, default arms."""
    register(
        "uniform", uniform, default=True, description="a uniform random round(B / (1 + beta)) of every source batch"
    )
    register(
        "sift-probabilistic",
        _sift_arm("probabilistic"),
        default=True,
        description="SiftingDataloader, keep with probability percentile ** beta",
    )
    register(
        "sift-fixed",
        _sift_arm("fixed"),
        default=True,
        description="SiftingDataloader(selection_mode='fixed'): round(B / (1 + beta)) per source batch",
    )
