"""What the runner measures besides accuracy: the clock (wall and CPU time, paused while
the runner evaluates) and, on torch-xla, the compile count and host reads."""

import time
from collections.abc import Callable


class Clock:
    """Wall-clock with pause (evaluation is not training time), and beside it the process's
    CPU time over the same intervals (``cpu_total``): on a shared machine other processes
    stretch the wall-clock, not the CPU time of a one-thread eager run, which is what its
    wall-clock would be on an idle machine (``--clock cpu`` reports with it)."""

    def __init__(self, sync: Callable[[], None] | None = None):
        self.total = 0.0
        self.cpu_total = 0.0
        self.start: float | None = None
        self.cpu_start: float | None = None
        self.sync = sync

    @property
    def running(self) -> bool:
        return self.start is not None

    def resume(self) -> None:
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()

    def pause(self) -> None:
        if self.start is None or self.cpu_start is None:
            raise RuntimeError("Clock.pause(): the clock is not running")
        if self.sync is not None:
            self.sync()  # wait for the device before reading the clock
        self.total += time.perf_counter() - self.start
        self.cpu_total += time.process_time() - self.cpu_start
        self.start = self.cpu_start = None


class XlaCounters:
    """Compile count and host reads (torch_xla.debug.metrics), evaluation excluded: the
    runner snapshots them around every evaluation and adds up the differences
    (``add_since``)."""

    def __init__(self):
        import torch_xla.debug.metrics as met

        from neuron_sift.backends.xla import xla_compile_count  # imports torch_xla: only here

        self.met = met
        self.compile_count = xla_compile_count
        self.compiles = 0
        self.reads = 0
        self._snap: tuple[int, int] | None = None

    def snapshot(self) -> tuple[int, int]:
        r = self.met.metric_data("TransferFromDeviceTime")
        return self.compile_count(), (r[0] if r else 0)

    def add_since(self) -> None:
        """Count what happened since the last ``mark()`` (nothing before the first)."""
        if self._snap is not None:
            c, r = self.snapshot()
            self.compiles += c - self._snap[0]
            self.reads += r - self._snap[1]

    def mark(self) -> None:
        self._snap = self.snapshot()
