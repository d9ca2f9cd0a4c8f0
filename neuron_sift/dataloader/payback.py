"""The payback check: at warm-up, what per-batch sifting costs against a training step, and
the share of steps its selection must save to pay.

Why: per-batch sifting scores ``1 / s`` source batches for every batch it yields (``s``
the kept share), so a trained batch costs ``c = 1 + f / s + l`` training steps, ``f`` the
scoring forward's cost per source batch and ``l`` a scoring model's own training step,
both as shares of a step. Selection pays only if it reaches the same result in fewer than
``1 / c`` of the steps, i.e. saves ``1 - 1 / c`` of them; with the model itself as scorer
that share is usually larger than what loss-based selection saves, and the user should
know before a long run. The check logs the break-even once and warns when it is above
``IMPLAUSIBLE_SAVING``, naming the cheaper scorers.

The loader measures both on the user's own run (not on XLA, whose lazy graphs a timing
would cut where they are not cut later, so that a cut graph compiles again after the
warm-up): the scoring forward (and a scoring
model's step) inside the loader, and the training step as the time the loop spends
between taking a batch and asking for the next. Only the measured batches wait for the
device (``Backend.wait``) so the times are the work's, not its launch; the first
``WARMUP`` of each are left out (compilation), then ``MEASURED`` are averaged, within the
first pass over the source (what it has by the pass's end, if fewer). Nothing it does
changes a selection.
"""

import logging
import time

from neuron_sift.backends.base import Backend
from neuron_sift.shared.logs import LOADER_LOGGER

logger = logging.getLogger(LOADER_LOGGER)

WARMUP = 2  # measurements left out at the start (compilation, caches)
MEASURED = 6  # measurements averaged after them
IMPLAUSIBLE_SAVING = 0.4  # a selection rarely saves more of the steps than this (docs/cheaper-scorers.md)
CHEAPER = (
    "a cheaper scorer: scoring_model= (a smaller model), criterion='excess' or 'reference' with a reference "
    "table (neuron_sift.score_dataset), or scoring_precision='bfloat16'"
)


class PaybackCheck:
    """Times the scoring of source batches and the loop's steps until it has ``MEASURED``
    of each past ``WARMUP``, then reports once (``report``). ``kept_share``: the expected
    share of scored samples kept."""

    def __init__(self, backend: Backend, kept_share: float) -> None:
        self.backend = backend
        self.kept_share = kept_share
        self.scoring: list[float] = []
        self.steps: list[float] = []
        self.learning: list[float] = []
        # Off where device times mean nothing (graph extraction) or cannot be read without
        # cutting the training graph where it is not cut later (a device that compiles per
        # graph: the cut graph would compile again after the warm-up).
        self.done = backend.extraction_only or backend.fixed_shapes
        if backend.fixed_shapes and not backend.extraction_only and logger.isEnabledFor(logging.INFO):
            logger.info(
                "payback: off on %s (reading its times would cut the training graph and compile it again later); "
                "benchmarks/step_costs.py measures the scoring forward's share of a step on the device",
                backend.device,
            )
        self._yielded_at: float | None = None
        self._scoring_started: float | None = None
        self._learning_started: float | None = None
        self.report: dict[str, float] | None = None

    def _wanted(self, samples: list[float]) -> bool:
        return not self.done and len(samples) < WARMUP + MEASURED

    def scoring_starts(self) -> None:
        if self._wanted(self.scoring):
            self.backend.wait()
            self._scoring_started = time.perf_counter()

    def scoring_ends(self) -> None:
        if self._scoring_started is not None:
            self.backend.wait()
            self.scoring.append(time.perf_counter() - self._scoring_started)
            self._scoring_started = None
            self._maybe_report()

    def learning_starts(self) -> None:
        """A scoring model's training step on a yielded batch begins."""
        if self._wanted(self.learning):
            self.backend.wait()
            self._learning_started = time.perf_counter()

    def learning_ends(self) -> None:
        if self._learning_started is not None:
            self.backend.wait()
            self.learning.append(time.perf_counter() - self._learning_started)
            self._learning_started = None
            self._maybe_report()

    def yielding(self) -> None:
        """A batch goes to the loop: its step starts now."""
        if self._wanted(self.steps):
            self.backend.wait()
            self._yielded_at = time.perf_counter()

    def resumed(self) -> None:
        """The loop asks for the next batch: the step of the last one is over."""
        if self._yielded_at is not None:
            self.backend.wait()
            self.steps.append(time.perf_counter() - self._yielded_at)
            self._yielded_at = None
            self._maybe_report()

    def pass_ended(self) -> None:
        """The first pass over the source ended: measure no more (a device that compiles a
        graph per sync point must meet no new one after its first epoch) and report what was
        measured past the warm-up, if anything."""
        if self.done:
            return
        self._scoring_started = self._yielded_at = self._learning_started = None
        if len(self.steps) > WARMUP and len(self.scoring) > WARMUP:
            self._report()
        self.done = True

    def _maybe_report(self) -> None:
        if self.done or len(self.steps) < WARMUP + MEASURED or len(self.scoring) < WARMUP + MEASURED:
            return
        self._report()

    def _report(self) -> None:
        self.done = True
        step = _mean(self.steps[WARMUP:])
        if step <= 0.0:
            return
        forward = _mean(self.scoring[WARMUP:]) / step
        learn = _mean(self.learning[WARMUP:]) / step if len(self.learning) > WARMUP else 0.0
        cost = 1.0 + forward / self.kept_share + learn
        saving = 1.0 - 1.0 / cost
        self.report = {
            "forward_share": forward,
            "learn_share": learn,
            "cost_per_trained_batch": cost,
            "break_even_saving": saving,
        }
        if logger.isEnabledFor(logging.INFO):  # the loader's rule: no INFO line formatted without INFO
            logger.info(
                "payback: scoring a source batch costs %.2f of a training step%s; at kept share %.2f a trained batch "
                "costs %.2f steps, so selection must reach the same result in %.0f%% fewer steps to pay",
                forward,
                f" and the scoring model's step {learn:.2f}" if learn else "",
                self.kept_share,
                cost,
                100.0 * saving,
            )
        if saving > IMPLAUSIBLE_SAVING:
            logger.warning(
                "payback: per-batch sifting pays only if its selection saves %.0f%% of the training steps, more than "
                "loss-based selection usually does; consider %s (docs/cheaper-scorers.md, When it pays)",
                100.0 * saving,
                CHEAPER,
            )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
