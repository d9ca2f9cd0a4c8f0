"""The command-line options the suite and the standalone measurements share: which clock
times a run and how many threads torch uses.

Defined once so that ``--clock cpu`` and ``--threads`` mean the same in every script and
in every record they write (the records carry the option's value, not its definition).
"""

import argparse
import time
from collections.abc import Callable

import torch

# --clock: wall-clock, or the process's CPU seconds over the same interval (all threads,
# the XLA CPU device's included), which a shared machine's other load disturbs much less.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def add_clock(p: argparse.ArgumentParser, help: str, default: str = "wall") -> None:
    p.add_argument("--clock", choices=tuple(CLOCKS), default=default, help=help)


def add_threads(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--threads", type=int, default=1, help=help)


def use_threads(threads: int) -> None:
    """``--threads``: 0 leaves torch's default."""
    if threads:
        torch.set_num_threads(threads)
