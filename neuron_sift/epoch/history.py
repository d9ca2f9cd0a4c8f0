"""What each epoch's plan was and what sifting's own work cost: the record behind
``metrics()``, the metrics surface and the logs.

Why kept apart from the plan itself: a plan is replaced each epoch, while users read the
run's whole course (kinds, kept shares, weights) and a resumed run must report the
epochs before the interruption too, so the record travels in the checkpoint (its
``"history"`` part; the loader calls it ``history`` too).

Why it records the trained samples, not the drawn ones: with ``drop_last`` each rank's
short last batch is cut off, so a plan draws more samples than any rank trains; a kept
share that counted them would report work that never happened. ``kept`` is what the
ranks train, ``planned`` what the plan drew, and ``observed_kept_share`` the measured
share ``kept / M``, named apart from the setting ``EpochSiftConfig.kept_share`` (a
budget); each entry also carries it as ``kept_share``, an alias kept for one release.

Epoch numbering, one convention everywhere (the history, ``metrics()``, the log lines,
the pairing of losses): ``epoch`` is the 0-based index of an epoch, as in
``EpochPlan.epoch``; counts of epochs are named as counts (``epochs_started``).
"""

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import torch

from neuron_sift.epoch.planner import EpochPlan
from neuron_sift.shared.counts import PhaseTimings
from neuron_sift.shared.logs import EPOCH_LOGGER

# The epoch loader's one logger: users configure it by this name whichever part logs.
logger = logging.getLogger(EPOCH_LOGGER)


class EpochHistory(Sequence[dict[str, Any]]):
    """One entry per planned epoch (the sequence itself), and the host seconds of each of
    sifting's phases (``timings``: ``planning`` and ``weighted_loss``).

    ``n``: the samples plans draw from (kept shares are of these); ``trained``: how many
    samples of a plan the ranks train, and the weights of those this rank trains
    (``EpochPlanner.trained_weights``; None: all of the plan's, which holds every rank's).
    """

    def __init__(self, n: int, trained: Callable[[EpochPlan], tuple[int, torch.Tensor]] | None = None) -> None:
        self.n = n
        self.trained = trained
        self.entries: list[dict[str, Any]] = []
        self.timings = PhaseTimings(logger, log_each=False)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self.entries[i]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.entries)

    def planned(self, plan: EpochPlan, batches: int, seconds: float) -> None:
        self.timings.record("planning", seconds)
        kept, kept_w = self.trained(plan) if self.trained is not None else (plan.kept, plan.weights[plan.order])
        if not kept_w.numel():
            kept_w = torch.ones(1)
        entry = {
            "epoch": plan.epoch,
            "kind": plan.kind,
            "kept": kept,
            "observed_kept_share": kept / self.n,
            "kept_share": kept / self.n,  # the alias of observed_kept_share, for one release
            "planned": plan.kept,
            "mean_weight": float(kept_w.mean()),
            "max_weight": float(kept_w.max()),
            "batches": batches,
            "excluded": plan.excluded,
            "planning_seconds": seconds,
        }
        self.entries.append(entry)
        logger.info(
            "epoch %d (%s): trains %d of %d samples (%.3f), %d batches, mean weight %.3f, planned in %.4f s",
            plan.epoch,
            plan.kind,
            kept,
            self.n,
            entry["observed_kept_share"],
            batches,
            entry["mean_weight"],
            seconds,
        )

    def spent(self, phase: str, seconds: float) -> None:
        self.timings.record(phase, seconds)

    def seconds(self, phase: str) -> float:
        return self.timings.seconds(phase)

    @property
    def machinery_seconds(self) -> float:
        return self.timings.machinery_seconds

    def state_dict(self) -> dict[str, Any]:
        """The entries; the timings are not kept (they measure this process)."""
        return {"epochs": [dict(h) for h in self.entries]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Entries saved before ``observed_kept_share`` existed carry it as ``kept_share``."""
        self.entries = [{"observed_kept_share": h.get("kept_share"), **h} for h in state["epochs"]]
