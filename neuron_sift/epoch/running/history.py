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
budget). A record saved before 0.5.0 names it ``kept_share``, one of 0.5.0 to 0.7.0 both:
either loads into ``observed_kept_share`` alone.

Why every count and weight is of all ranks, whatever the score table: a run is one
training run, and the same run must read the same under either table and on every rank
(a dashboard fed by rank 0, a log compared across ranks). A replicated plan holds every
rank's samples; a sharded plan holds one rank's, so its planner combines the ranks'
weights when the epoch opens (``EpochPlanner.trained_counts``).

Epoch numbering, one convention everywhere (the history, ``metrics()``, the log lines,
the pairing of losses): ``epoch`` is the 0-based index of an epoch, as in
``EpochPlan.epoch``; counts of epochs are named as counts (``epochs_started``).
"""

import logging
from collections.abc import Iterator, Sequence
from typing import Any, overload

from neuron_sift.epoch.planning.plan import EpochPlan, TrainedCounts
from neuron_sift.shared.counts import PhaseTimings
from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.shared.state_checks import describe, invalid, need_int, need_mapping, need_real

# The epoch loader's one logger: users configure it by this name whichever part logs.
logger = logging.getLogger(EPOCH_LOGGER)

# An entry's counts and its shares, weights and seconds (``EpochHistory.check_state``).
_ENTRY_COUNTS = ("epoch", "kept", "planned", "batches", "excluded")
_ENTRY_REALS = ("observed_kept_share", "kept_share", "mean_weight", "max_weight", "planning_seconds")
# The start rule's measured rank correlation (a sifted epoch's, with the rule on; None otherwise).
_ENTRY_CORRELATION = "rank_correlation"


class EpochHistory(Sequence[dict[str, Any]]):
    """One entry per planned epoch (the sequence itself), and the host seconds of each of
    sifting's phases (``timings``: ``planning`` and ``weighted_loss``).

    ``n``: the samples plans draw from (kept shares are of these).
    """

    def __init__(self, n: int) -> None:
        self.n = n
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

    def planned(
        self,
        plan: EpochPlan,
        batches: int,
        seconds: float,
        counts: TrainedCounts,
        rank_correlation: float | None = None,
    ) -> None:
        """Record ``plan``'s entry: ``batches`` of this rank, planned in ``seconds``; ``counts``
        over all ranks (``EpochPlanner.trained_counts``); the start rule's ``rank_correlation``
        (a sifted epoch's: why a ``held`` epoch trained everything)."""
        self.timings.record("planning", seconds)
        kept = counts.kept
        entry = {
            "epoch": plan.epoch,
            "kind": plan.kind,
            "kept": kept,
            "observed_kept_share": kept / self.n,
            "planned": counts.planned,
            "mean_weight": counts.mean_weight,
            "max_weight": counts.max_weight,
            "batches": batches,
            "excluded": plan.excluded,
            "rank_correlation": rank_correlation,
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

    @staticmethod
    def check_state(state: Any) -> None:
        """Refuse a record that is not a list of entries with their counts and shares."""
        epochs = need_mapping(state, "history", ("epochs",))["epochs"]
        if not isinstance(epochs, list):
            invalid("history.epochs", f"must be a list of dicts (one per planned epoch), got {describe(epochs)}")
        for i, entry in enumerate(epochs):
            field = f"history.epochs[{i}]"
            need_mapping(entry, field, ("epoch", "kind", "kept"))
            if "observed_kept_share" not in entry and "kept_share" not in entry:
                invalid(field, "has neither observed_kept_share nor kept_share (its name before 0.5.0)")
            if not isinstance(entry["kind"], str):
                invalid(f"{field}.kind", f"must be a str, got {describe(entry['kind'])}")
            for key in _ENTRY_COUNTS:
                if key in entry:
                    need_int(entry[key], f"{field}.{key}", 0)
            for key in _ENTRY_REALS:
                if key in entry:
                    need_real(entry[key], f"{field}.{key}", 0.0)
            if entry.get(_ENTRY_CORRELATION) is not None:
                correlation = need_real(entry[_ENTRY_CORRELATION], f"{field}.{_ENTRY_CORRELATION}", -1.0)
                if correlation > 1.0:
                    invalid(f"{field}.{_ENTRY_CORRELATION}", f"must be <= 1.0, got {correlation!r}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Entries saved before ``observed_kept_share`` existed carry it as ``kept_share``;
        entries of 0.5.0 to 0.7.0 carry both (the alias is no longer kept in the record)."""
        self.check_state(state)
        self.entries = [
            {"observed_kept_share": h.get("kept_share"), **{k: v for k, v in h.items() if k != "kept_share"}}
            for h in state["epochs"]
        ]
