"""The training loops the arms share: one optimizer step, the plain loop of the full-data
and subset arms, and one epoch of a loss-weighted loop over a planned subset (the
``infobatch`` arm and the ``epoch`` arms)."""

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from benchmarks.core.context import ArmContext
from benchmarks.core.fairness import CosineSchedule


def optimizer_step(ctx: ArmContext, loss: torch.Tensor, sched: CosineSchedule) -> None:
    """Backward ``loss``, step the optimizer, then the learning-rate schedule."""
    ctx.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    ctx.optimizer.step()
    sched.step()


def train_plain(
    ctx: ArmContext, loader: Iterable, epochs: int, sched: CosineSchedule, seen_of: Callable[[], int] | None = None
) -> int:
    """The plain loop (mean cross-entropy) over ``loader`` for ``epochs`` passes; returns the
    samples trained. ``seen_of()`` gives the source samples passed over (default: trained)."""
    trained = 0
    for _ in range(epochs):
        for x, y, ids in loader:
            x, y = ctx.to_device(x, y)
            optimizer_step(ctx, F.cross_entropy(ctx.model(x), y), sched)
            trained += int(ids.shape[0])
            ctx.trained(ids, seen=seen_of() if seen_of else trained)
        ctx.end_epoch()
    return trained


def train_weighted_epoch(
    ctx: ArmContext,
    batches: Iterable,
    sched: CosineSchedule,
    epoch: int,
    kept: int,
    weighted: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """Epoch ``epoch`` over ``batches``, which hold the ``kept`` samples of the dataset the
    epoch's plan kept: per step the per-sample cross-entropy, turned into the loss by
    ``weighted(ids, per_sample)``, one optimizer step. The samples the plan skipped count
    as passed over in proportion, so evaluations fall at the same fractions of each epoch
    as in the other arms."""
    n = len(ctx.dataset)
    done = 0
    for x, y, ids in batches:
        x, y = ctx.to_device(x, y)
        per_sample = F.cross_entropy(ctx.model(x), y, reduction="none")
        optimizer_step(ctx, weighted(ids, per_sample), sched)
        done += int(ids.shape[0])
        ctx.trained(ids, seen=epoch * n + (n * done) // max(kept, 1))
    ctx.end_epoch()
