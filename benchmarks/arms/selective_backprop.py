"""A per-batch peer with the sifting loader's cost model, for the single-pass LM task:
MosaicML Composer's SelectiveBackprop, reimplemented here from its documented rule.

The rule: while active, each batch of N samples is scored by a no-grad forward, and
``keep * N`` of them (rounded) are drawn without replacement, each with probability
proportional to its loss's percentile within the batch raised to ``1 / keep - 1``; the
optimizer step trains on those alone, a smaller batch. It is active from ``start`` to
``end`` of the run (shares of its steps; Composer's defaults 0.5 and 0.9) and then only on
every ``interrupt``-th batch's complement: with ``interrupt`` 2, batches 0, 2, 4, ... are
selected and 1, 3, 5, ... are full steps (0: every batch in the window).

Why beside the sifting arms: it spends the same scoring forward per source batch but reads
no further into the stream: it trains smaller batches for the same steps, where the
sifting loader trains full batches gathered from more source batches.

The percentile of the sample of rank ``r`` (0 = lowest loss) among N is the mid-rank
``(r + 0.5) / N``, so even the lowest loss keeps a non-zero chance; ties take the order of
the batch. ``keep * N`` is rounded down (at least 1), so a batch never trains more than
``keep`` of itself.
"""

from collections.abc import Callable

import torch

from benchmarks.core.lm_context import LMContext, keep_count


def selection_probabilities(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """Each sample's weight: its loss percentile in the batch ** (1 / keep - 1), normalised."""
    n = losses.numel()
    if n < 1 or not 0.0 < keep <= 1.0:
        raise ValueError(f"need at least one loss and keep in (0, 1], got {n} losses and keep={keep}")
    rank = torch.empty(n, dtype=torch.float64)
    rank[torch.argsort(losses.detach().flatten().double().cpu(), stable=True)] = torch.arange(n, dtype=torch.float64)
    weight = ((rank + 0.5) / n) ** (1.0 / keep - 1.0)
    return weight / weight.sum()


def select(losses: torch.Tensor, keep: float, generator: torch.Generator) -> torch.Tensor:
    """The rows trained: ``keep_count(keep, N)`` drawn without replacement by the rule, sorted."""
    k = keep_count(keep, losses.numel())
    probs = selection_probabilities(losses, keep)
    return torch.multinomial(probs, k, replacement=False, generator=generator).sort().values


def is_active(step: int, total: int, start: float, end: float, interrupt: int) -> bool:
    """Whether step ``step`` (0-based) of ``total`` selects: inside [start, end) of the run
    and, with ``interrupt`` k > 0, not on every k-th batch ((step + 1) % k == 0: full steps)."""
    frac = step / max(total, 1)
    in_window = start <= frac < end
    return in_window and (interrupt == 0 or (step + 1) % interrupt != 0)


def selective_backprop(ctx: LMContext) -> dict:
    cfg = ctx.config
    total = ctx.schedule()
    g = torch.Generator().manual_seed(ctx.seed + 777)
    seen = selected = 0
    for seq, _ in ctx.source:
        seen += int(seq.shape[0])
        if is_active(ctx.steps, total, cfg.sb_start, cfg.sb_end, cfg.sb_interrupt):
            with ctx.parts.timed("scoring"), torch.no_grad():
                ctx.model.eval()
                losses = ctx.losses(seq.to(ctx.device))
                ctx.model.train()
                if ctx.sync:  # torch-xla: run the scoring graph here, not in the selection's read
                    ctx.sync()
            ctx.scoring_samples += int(seq.shape[0])
            with ctx.parts.timed("machinery"):
                seq = seq[select(losses, cfg.sb_keep, g)]
            selected += 1
        ctx.train_step(seq, seen)
        if ctx.done:
            break
    return {"sb_keep": cfg.sb_keep, "sb_selected_steps": selected}


def register_arms(register: Callable[..., Callable]) -> None:
    """``lm-selective-backprop``, a default arm of the LM task."""
    register(
        "lm-selective-backprop",
        selective_backprop,
        default=True,
        single_pass=True,
        description="Composer's SelectiveBackprop rule (keep 0.5, active 50%-90%, every other batch)",
    )
