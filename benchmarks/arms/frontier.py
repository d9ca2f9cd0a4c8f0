"""The full-data frontier: ``full@X`` trains on every sample for the fraction X of the task's
epochs (rounded up), its learning rate decayed to that run's own end; ``full`` is
``full@1.0``, whose final accuracy sets the target.

Why a frontier and not ``full`` alone: a method that trains less than ``full`` has to beat
a full-data run of the same length, not only the full-length one; data-selection gains
often vanish against the shortened runs. The registry builds ``full@X`` for any X in
(0, 1] on demand (``registry.get_arm``); the four registered here are default arms.
"""

import math
from collections.abc import Callable

from benchmarks.core.context import ArmContext
from benchmarks.core.loops import train_plain


def frontier_epochs(fraction: float, epochs: int) -> int:
    """``fraction`` of ``epochs``, rounded up (at least 1)."""
    return max(1, math.ceil(round(fraction * epochs, 9)))


def full_arm(fraction: float) -> Callable[[ArmContext], dict]:
    def full(ctx: ArmContext) -> dict:
        epochs = frontier_epochs(fraction, ctx.epochs)
        sched = ctx.step_schedule(epochs * len(ctx.source))
        trained = train_plain(ctx, ctx.source, epochs, sched)
        return {"samples_kept": trained, "epochs": epochs}

    full.__doc__ = f"Every sample, {fraction:g} of the task's epochs (rounded up), lr decayed to that end."
    return full


def register_arms(register: Callable[..., Callable]) -> None:
    """``full@0.4``, ``full@0.6``, ``full@0.8`` and ``full``, default arms."""
    register("full@0.4", full_arm(0.4), default=True, description="all data, 0.4 of the epochs", frontier=0.4)
    register("full@0.6", full_arm(0.6), default=True, description="all data, 0.6 of the epochs", frontier=0.6)
    register("full@0.8", full_arm(0.8), default=True, description="all data, 0.8 of the epochs", frontier=0.8)
    register("full", full_arm(1.0), default=True, description="all data, all epochs (full@1.0)", frontier=1.0)
