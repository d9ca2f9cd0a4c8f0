"""Warnings that repeat every source batch, logged at a bounded rate with exact counts.

A run whose loss has diverged produces non-finite losses in every source batch, and a
data-parallel rank that keeps more than its peers drops samples at many agreement
points: one log line each would bury everything else in the log. The first occurrence is
logged in full (it says what happened and why); after it, one summary line per
``interval`` source batches and one at the end of each epoch give the counts since the
last line. The counters in ``SiftingCounts`` stay exact whatever is logged.
"""

import logging

from neuron_sift.shared.validation import positive_int


class RateLimitedNotice:
    """One kind of repeated warning: first occurrence in full, then periodic summaries."""

    def __init__(self, logger: logging.Logger, first: str, summary: str, interval: int = 100):
        self.logger = logger
        self.first = first  # format with (count, where)
        self.summary = summary  # format with (count, occurrences, source batches)
        self.interval = positive_int(interval, "interval", what="source batches between summary lines")
        self.total = 0  # every occurrence ever reported, logged or not
        self._unlogged = 0
        self._unlogged_batches = 0
        self._batches_since_line: int | None = None  # None until the first occurrence

    def report(self, count: int, where: str) -> None:
        """``count`` occurrences in one source batch (``where``); 0 is allowed and ticks the clock."""
        if self._batches_since_line is not None:
            self._batches_since_line += 1
        if count <= 0:
            self._maybe_summarise()
            return
        self.total += count
        if self._batches_since_line is None:
            self._batches_since_line = 0
            self.logger.warning(self.first, count, where)
            return
        self._unlogged += count
        self._unlogged_batches += 1
        self._maybe_summarise()

    def _maybe_summarise(self) -> None:
        if self._unlogged and self._batches_since_line is not None and self._batches_since_line >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Log what was not logged yet (end of an epoch)."""
        if not self._unlogged:
            return
        self.logger.warning(self.summary, self._unlogged, self._unlogged_batches, self._batches_since_line)
        self._unlogged = 0
        self._unlogged_batches = 0
        self._batches_since_line = 0


def nonfinite_notice(logger: logging.Logger) -> RateLimitedNotice:
    """Non-finite losses: kept for training, never recorded in the loss history."""
    return RateLimitedNotice(
        logger,
        "%d non-finite loss value(s) in %s: kept for training (never recorded in the loss history); "
        "further occurrences are summarised",
        "%d more non-finite loss value(s) in %d of the last %d source batches (kept for training, never "
        "recorded in the loss history)",
    )


def drop_notice(logger: logging.Logger) -> RateLimitedNotice:
    """Kept samples a data-parallel rank drops at its ``max_pending`` bound."""
    return RateLimitedNotice(
        logger,
        "%d kept sample(s) dropped at %s: this rank's pending samples reached max_pending while its peers "
        "kept fewer (ranks must emit the same number of batches); further drops are summarised",
        "%d more kept sample(s) dropped in %d of the last %d source batches (pending samples at max_pending)",
    )
