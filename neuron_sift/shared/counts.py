"""Counts and phase timings, the one way both loaders keep them.

Why one way: the metrics, the integrations and the checkpoints read every count by name;
a count set that saves, restores and refuses the same way in both modes keeps every
reader on the same numbers, and a state from before a count existed still loads.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from neuron_sift.shared.state_checks import need_int, need_mapping

T = TypeVar("T")


class CountSet:
    """A dataclass of int counts (its public fields) with a ``state_dict``.

    ``NEWER``: counts added after the first checkpoints were written; a state without one
    restores it as 0. Any other missing count, or an unknown one, is refused.
    """

    NEWER: tuple[str, ...] = ()
    IGNORED: tuple[str, ...] = ()  # saved for readers, restored from elsewhere (neither required nor set)
    PART = "counts"  # the part's name in its loader's state, for a refusal's message

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if not f.name.startswith("_"))  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in self.names()}

    def state_dict(self) -> dict[str, int]:
        return self.as_dict()

    def check_state(self, state: Any) -> None:
        """Refuse a state with an unknown count, without one (but ``NEWER`` ones), or with a
        count that is not an int >= 0; changes nothing."""
        field = self.PART
        need_mapping(state, field)
        names = self.names()
        unknown = sorted(set(state) - set(names) - set(self.IGNORED))
        if unknown:
            raise ValueError(f"unknown count(s) in the checkpoint: {unknown}")
        missing = [n for n in self._restored() if n not in state and n not in self.NEWER]
        if missing:
            raise ValueError(f"incomplete checkpoint: no count {', '.join(missing)}")
        for name, value in state.items():
            need_int(value, f"{field}.{name}", 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        for name in self._restored():
            setattr(self, name, int(state.get(name, 0)))

    def _restored(self) -> list[str]:
        return [n for n in self.names() if n not in self.IGNORED]


class PhaseTimings:
    """Host seconds and calls per phase of a loader, each also logged at INFO (``log_each``).

    The per-batch loader's phases: ``transform``, ``calculate_relevance_values`` (the user's
    scoring forward, ``SCORING``), ``should_sift``, ``sift``, ``accumulate``,
    ``reverse_transform``, and ``train_scorer`` (a scoring model's own step, ``SCORING`` too);
    the epoch loader's: ``planning`` and ``weighted_loss``. Host
    time: on XLA the device runs asynchronously, so a phase that reads a result back also
    waits for the device work it depends on.
    """

    SCORING = ("calculate_relevance_values", "train_scorer")  # the scorer's work, not the machinery's

    def __init__(self, logger: logging.Logger, log_each: bool = True):
        self.logger = logger
        self.log_each = log_each
        self.entries: dict[str, list[Any]] = {}  # name -> [seconds, calls]

    def run(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        start = time.perf_counter()
        out = fn(*args)
        self.record(name, time.perf_counter() - start)
        return out

    def record(self, name: str, seconds: float) -> None:
        """One call of phase ``name`` that took ``seconds``."""
        entry = self.entries.setdefault(name, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
        if self.log_each and self.logger.isEnabledFor(logging.INFO):
            self.logger.info("func:%s latency: %.6f", name, seconds)

    def seconds(self, name: str) -> float:
        return float(self.entries.get(name, [0.0, 0])[0])

    @property
    def machinery_seconds(self) -> float:
        """Host seconds in sifting's own phases (every phase but the scorer's work)."""
        return sum(v[0] for k, v in self.entries.items() if k not in self.SCORING)

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {k: {"seconds": v[0], "calls": v[1]} for k, v in self.entries.items()}
