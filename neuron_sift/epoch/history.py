"""What each epoch's plan was and what sifting's own work cost: the record behind
``metrics()``, the metrics surface (``neuron_sift.metrics.epoch_metrics``) and the logs.

Why kept apart from the plan itself: a plan is replaced each epoch, while users read the
run's whole course (kinds, kept shares, weights) and a resumed run must report the
epochs before the interruption too, so the record travels in the checkpoint.

Why it records the trained samples, not the drawn ones: with ``drop_last`` each rank's
short last batch is cut off, so a plan draws more samples than any rank trains; a kept
share that counted them would report work that never happened. ``kept`` is what the
ranks train, ``planned`` what the plan drew.

Epoch numbering, one convention everywhere (the history, ``metrics()``, the log lines):
``epoch`` is the 0-based index of an epoch, as in ``EpochPlan.epoch``; counts of epochs are
named as counts (``epochs_started``).
"""

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from neuron_sift.epoch.planner import EpochPlan
from neuron_sift.shared.logs import EPOCH_LOGGER

if TYPE_CHECKING:  # hints only: the record reads these parts, it does not build them
    from neuron_sift.epoch.pairing import PairingQueue
    from neuron_sift.epoch.progress import EpochProgress
    from neuron_sift.epoch.tables import ScoreTables

# The epoch loader's one logger: users configure it by this name whichever part logs.
logger = logging.getLogger(EPOCH_LOGGER)


class EpochHistory:
    """One entry per planned epoch, and host seconds spent in planning and ``weighted_loss``.

    ``n``: the samples plans draw from (kept shares are of these); ``trained_ids``: the ids of
    a plan that some rank trains (``EpochPlanner.trained_ids``; None: all of the plan's).
    """

    def __init__(self, n: int, trained_ids: Callable[[EpochPlan], torch.Tensor] | None = None) -> None:
        self.n = n
        self.trained_ids = trained_ids
        self.entries: list[dict[str, Any]] = []
        self.timings: dict[str, float] = {"planning": 0.0, "weighted_loss": 0.0}

    def planned(self, plan: EpochPlan, batches: int, seconds: float) -> None:
        self.timings["planning"] += seconds
        trained = self.trained_ids(plan) if self.trained_ids is not None else plan.order
        kept = int(trained.shape[0])
        kept_w = plan.weights[trained] if kept else torch.ones(1)
        entry = {
            "epoch": plan.epoch,
            "kind": plan.kind,
            "kept": kept,
            "kept_share": kept / self.n,
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
            entry["kept_share"],
            batches,
            entry["mean_weight"],
            seconds,
        )

    def spent(self, kind: str, seconds: float) -> None:
        self.timings[kind] += seconds

    @property
    def machinery_seconds(self) -> float:
        return self.timings["planning"] + self.timings["weighted_loss"]

    def state_dict(self) -> dict[str, Any]:
        """The entries; the timings are not kept (they measure this process)."""
        return {"epochs": [dict(h) for h in self.entries]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = [dict(h) for h in state["epochs"]]


def epoch_report(
    history: EpochHistory, progress: "EpochProgress", pairing: "PairingQueue", tables: "ScoreTables"
) -> dict[str, Any]:
    """``EpochSiftingDataloader.metrics()``: every part's counts in one snapshot (one host
    read of the score table on a device). ``epoch`` is the current epoch's 0-based index
    (None before the first is planned); ``epoch_finished`` says whether every batch of it on
    this rank has its losses (or was skipped)."""
    scores = tables.snapshot()
    last = history.entries[-1] if history.entries else {}
    counts = pairing.counts
    return {
        "epoch": progress.epochs_started - 1 if progress.epochs_started else None,
        "epochs_started": progress.epochs_started,
        "epoch_finished": progress.finished(),
        "epoch_kind": last.get("kind"),
        "kept_share": last.get("kept_share", 1.0),
        "mean_weight": last.get("mean_weight", 1.0),
        "max_weight": last.get("max_weight", 1.0),
        "batches_planned": len(progress.batches),
        "batches_yielded": counts["batches_yielded"],
        "batches_recorded": counts["batches_recorded"],
        "batches_skipped": counts["batches_skipped"],
        "losses_recorded": counts["losses_recorded"],
        "scores_recorded": int((~torch.isnan(scores)).sum()),
        "num_nonfinite_losses": tables.nonfinite(),
        "unpaired_batches": pairing.dropped_batches,
        "excluded_by_guard": last.get("excluded", 0),
        "planning_seconds": history.timings["planning"],
        "weighted_loss_seconds": history.timings["weighted_loss"],
        "machinery_seconds": history.machinery_seconds,
        "epochs": [dict(h) for h in history.entries],
    }
