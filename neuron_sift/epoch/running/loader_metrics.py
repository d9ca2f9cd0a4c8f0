"""``EpochSiftingDataloader.metrics()``: every part's counts in one snapshot.

Why a module of its own: the snapshot reads the per-epoch iterator, the pairing, the
tables and the history, so it sits above all of them; the history, which the opening of
an epoch writes, then needs nothing from the iterator that opens epochs.
"""

from typing import Any

import torch

from neuron_sift.epoch.running.history import EpochHistory
from neuron_sift.epoch.running.pairing import PairingQueue
from neuron_sift.epoch.running.progress import EpochProgress
from neuron_sift.epoch.scores.tables import ScoreTables


def epoch_report(
    history: EpochHistory, progress: EpochProgress, pairing: PairingQueue, tables: ScoreTables
) -> dict[str, Any]:
    """The snapshot (one host read of the score table on a device). ``epoch`` is the
    current epoch's 0-based index (None before the first is planned); ``epoch_finished``
    says whether every batch of it on this rank has its losses (or was skipped).
    ``observed_kept_share``: the share of the samples the current epoch trains (apart from
    the setting ``EpochSiftConfig.kept_share``, a budget). The epoch's counts and weights
    (``observed_kept_share``, ``mean_weight``, ``max_weight``, ``excluded_by_guard``, and
    ``rank_correlation``, the start rule's measure of a sifted epoch: None when not measured)
    are of all ranks under either score table (``history.TrainedCounts``), the batch and loss counts
    of this rank, and ``scores_recorded`` of this rank's table (under a sharded table, the
    samples it owns): reading it starts no collective, so one rank may call it alone."""
    scores = tables.snapshot()
    last = history[-1] if len(history) else {}
    counts = pairing.counts
    observed = last.get("observed_kept_share", 1.0)
    return {
        "epoch": progress.current_epoch if progress.epochs_started else None,
        "epochs_started": progress.epochs_started,
        "epoch_finished": progress.finished(),
        "epoch_kind": last.get("kind"),
        "observed_kept_share": observed,
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
        "rank_correlation": last.get("rank_correlation"),
        "planning_seconds": history.seconds("planning"),
        "weighted_loss_seconds": history.seconds("weighted_loss"),
        "machinery_seconds": history.machinery_seconds,
        "epochs": [dict(h) for h in history],
    }
