"""The progress line of ``score_dataset``: scored/total, samples per second, time left.

Why no progress-bar package: one line is all a scoring pass needs, and the package adds no
dependency for it. On a terminal the line is rewritten in place (``\\r``); in a log file
(a batch job's stderr) a line per tenth of the work keeps the log short.
"""

import sys
import time
from collections.abc import Callable
from typing import TextIO

REWRITE_S = 0.2  # the in-place line is rewritten at most this often


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class ScoringProgress:
    """Reports ``done`` of ``total`` samples; the rate counts only what this call scored
    (``start`` samples were done by an earlier, interrupted call)."""

    def __init__(
        self,
        total: int,
        start: int,
        enabled: bool,
        label: str = "score_dataset",
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = total
        self.start = start
        self.enabled = enabled and total > start
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.began = clock()
        self.in_place = self.enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.tenths = -1  # the last tenth of the work reported (log mode)
        self.written = float("-inf")  # when the in-place line was last rewritten
        self.done = start

    def line(self) -> str:
        elapsed = self.clock() - self.began
        rate = (self.done - self.start) / elapsed if elapsed > 0 else 0.0
        left = _duration((self.total - self.done) / rate) if rate > 0 else "?"
        return f"{self.label}: {self.done}/{self.total} samples scored, {rate:.1f} samples/s, {left} left"

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        if self.in_place:
            now = self.clock()
            if now - self.written >= REWRITE_S or done >= self.total:  # a terminal needs no more
                self.written = now
                self.stream.write("\r" + self.line())
                self.stream.flush()
            return
        tenths = done * 10 // self.total
        if tenths > self.tenths:
            self.tenths = tenths
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        """End the in-place line (the log's last line is written when the work reaches its end)."""
        if self.enabled and self.in_place:
            self.stream.write("\n")
            self.stream.flush()
