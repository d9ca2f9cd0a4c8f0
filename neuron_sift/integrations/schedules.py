"""Lengths for learning-rate schedules and for trainers that plan from ``len()``.

``SiftingDataloader.__len__`` covers the next epoch: exact in ``fixed`` mode, the
expected count in ``probabilistic`` mode. A schedule spans many epochs, and the epochs of
a sifted loader differ in length (the ``sift_delay`` batches pass through unsifted in the
first epoch only, and kept samples not yet emitted carry over into the next epoch), so
``len(loader) * epochs`` is not the number of steps a run takes. Here:

- ``batches_per_epoch(loader, epochs)``: the batches each of the next ``epochs`` epochs
  of a ``SiftingDataloader`` emits; exact in ``fixed`` mode, expected in ``probabilistic``
  mode. ``batches_per_epoch(loader, 1)[0] == len(loader)``.
- ``planned_steps(loader, epochs, sigmas=0.0)``: their sum, optionally plus ``sigmas``
  standard deviations of the probabilistic count (a planning bound). It also takes an
  ``EpochSiftingDataloader`` (its own ``planned_steps``), so one function answers "how
  many steps" for both modes.
- ``ExactLengthLoader(loader, epochs=E)``: a view of either loader's stream in which every
  epoch is exactly ``len()`` batches long, so a schedule or a trainer sized from ``len()``
  ends exactly at its planned end. Epochs are then equal shares of the sifted stream
  rather than passes over the source data (see the class).
"""

import math
from typing import Any

from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.integrations.exact_length import ExactLengthLoader
from neuron_sift.integrations.passes import as_sifting_dataloader, round_half_up, sifting_loader_of

__all__ = [
    "ExactLengthLoader",
    "as_sifting_dataloader",
    "batches_per_epoch",
    "planned_steps",
    "planned_steps_std",
    "round_half_up",
]


def _plan(loader: Any, epochs: int):
    """Per-epoch batch counts and the number of scored source samples (the loader's plan)."""
    return as_sifting_dataloader(loader).plan_epochs(epochs)


def batches_per_epoch(loader: Any, epochs: int = 1) -> list[int]:
    """Batches emitted by each of the next ``epochs`` epochs of a ``SiftingDataloader``.

    Exact in ``fixed`` mode; in ``probabilistic`` mode the expected counts (kept share
    ``1 / (1 + beta)`` of every sifted sample). Accounts for ``sift_delay`` (and
    ``repeat_delay_per_epoch``) and for kept samples carried from one epoch to the next.
    Raises ``TypeError`` when the source loader has no length.
    """
    return _plan(loader, epochs)[0]


def planned_steps_std(loader: Any, epochs: int = 1) -> float:
    """Standard deviation, in batches, of the emitted count over the next ``epochs`` epochs.

    0 in ``fixed`` mode. In ``probabilistic`` mode each sifted sample is kept with marginal
    probability ``s = 1 / (1 + beta)`` when its loss percentile is uniform over the history
    (losses exchangeable within the history window), so n sifted samples keep
    ``n * s +- sqrt(n * s * (1 - s))``. While the loss falls fast relative to the history
    window, new losses rank low and fewer samples than that are kept.
    """
    sl = as_sifting_dataloader(loader)
    if sl.sift_config.keeps_exact_count:
        return 0.0
    return _std_of_count(sl, _plan(loader, epochs)[1])


def _std_of_count(sl: Any, sifted: int) -> float:
    """Binomial spread, in batches, of the kept count of ``sifted`` samples (probabilistic mode)."""
    if sl.sift_config.keeps_exact_count:
        return 0.0
    s = sl.sift_config.expected_kept_share()
    return math.sqrt(sifted * s * (1.0 - s)) / sl.batch_size


def planned_steps(loader: Any, epochs: int | None = 1, *, sigmas: float = 0.0) -> int:
    """Training steps (emitted batches) of the next ``epochs`` epochs of ``loader``.

    A ``SiftingDataloader`` (or an ``ExactLengthLoader`` around one): ``fixed`` mode exact;
    ``probabilistic`` mode the expected count plus ``sigmas`` standard deviations
    (``planned_steps_std``), rounded up; ``sigmas=4`` gives a count the run exceeds only
    rarely (e.g. ``OneCycleLR(total_steps=...)``, which raises when stepped past its end), a
    negative ``sigmas`` a count it rarely falls short of.

    An ``EpochSiftingDataloader`` (or a stream around one): its own
    ``planned_steps(epochs)`` (``epochs=None``: the rest of its ``num_epochs``); exact with a
    budget (``kept_share``), the expected count otherwise. ``sigmas`` does not apply: the
    epoch mode plans whole epochs, with no per-sample draw to bound.
    """
    sl = sifting_loader_of(loader)
    if not isinstance(sl, SiftingDataloader):
        return sl.planned_steps(epochs)
    if epochs is None:
        raise ValueError("planned_steps of a SiftingDataloader needs a number of epochs (an int >= 1)")
    plan, sifted = _plan(sl, epochs)  # planned once: a Python loop over every source batch
    total = sum(plan)
    if sigmas:
        total += math.ceil(sigmas * _std_of_count(sl, sifted))
    return max(total, 0)
