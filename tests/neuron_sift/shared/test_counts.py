"""Counts and phase timings (``neuron_sift.shared.counts``): what a checkpoint may and may not
lack, and which seconds count as sifting's own."""

import logging
import time
from dataclasses import dataclass

import numpy as np
import pytest

from neuron_sift.shared import counts as counts_module
from neuron_sift.shared.counts import CountSet, PhaseTimings


@dataclass
class Counts(CountSet):
    seen: int = 0
    kept: int = 0
    skipped: int = 0  # added after the first checkpoints
    _scratch: int = 0  # private: neither saved nor restored

    NEWER = ("skipped",)
    IGNORED = ("derived",)


def test_the_public_fields_are_the_counts():
    c = Counts(seen=np.int64(5), kept=2, skipped=1, _scratch=9)
    assert Counts.names() == ("seen", "kept", "skipped")
    assert c.as_dict() == c.state_dict() == {"seen": 5, "kept": 2, "skipped": 1}
    assert all(type(v) is int for v in c.as_dict().values())


def test_a_state_round_trips():
    c = Counts()
    c.load_state_dict(Counts(seen=4, kept=3, skipped=2).state_dict())
    assert c.as_dict() == {"seen": 4, "kept": 3, "skipped": 2}


def test_a_state_without_a_newer_count_restores_it_as_zero():
    c = Counts(skipped=6)
    c.load_state_dict({"seen": 4, "kept": 3})
    assert c.as_dict() == {"seen": 4, "kept": 3, "skipped": 0}


def test_an_ignored_key_is_accepted_and_not_restored():
    c = Counts()
    c.load_state_dict({"seen": 4, "kept": 3, "skipped": 0, "derived": 11})
    assert c.as_dict() == {"seen": 4, "kept": 3, "skipped": 0} and not hasattr(c, "derived")


def test_an_unknown_count_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"unknown count\(s\) in the checkpoint: \['bogus', 'zz'\]"):
        Counts().load_state_dict({"seen": 1, "kept": 1, "zz": 1, "bogus": 2})


def test_a_missing_count_is_refused_naming_it():
    c = Counts(seen=1, kept=1)
    with pytest.raises(ValueError, match="incomplete checkpoint: no count kept"):
        c.load_state_dict({"seen": 4})
    assert c.as_dict() == {"seen": 1, "kept": 1, "skipped": 0}  # a refused state changes nothing


@pytest.fixture
def timings():
    return PhaseTimings(logging.getLogger("neuron_sift.tests.timings"))


def test_record_adds_seconds_and_calls_per_phase(timings):
    timings.record("sift", 0.25)
    timings.record("sift", 0.5)
    timings.record("planning", 1.0)
    assert timings.seconds("sift") == 0.75 and timings.seconds("planning") == 1.0
    assert timings.seconds("never") == 0.0
    assert timings.as_dict() == {"sift": {"seconds": 0.75, "calls": 2}, "planning": {"seconds": 1.0, "calls": 1}}


class Clock:
    """A ``perf_counter`` that only the phase moves: the seconds a phase took are known exactly."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


def test_run_returns_what_the_phase_returns_and_times_it(timings, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(counts_module, "time", clock)

    def phase(seconds, a, b):
        clock.now += seconds  # the phase's own time
        return a + b

    clock.now += 7.0  # time before the phase is not the phase's
    assert timings.run("sift", phase, 0.25, 2, 3) == 5
    clock.now += 3.0  # nor time after it
    assert timings.run("sift", phase, 0.5, 1, 1) == 2
    assert timings.as_dict()["sift"] == {"seconds": 0.75, "calls": 2}


def test_run_times_a_phase_on_the_real_clock(timings):
    assert timings.run("sift", time.sleep, 0.02) is None
    assert timings.seconds("sift") >= 0.02  # at least the time the phase slept


def test_machinery_seconds_leave_out_the_scorers_work(timings):
    timings.record("calculate_relevance_values", 5.0)  # the scoring forward
    timings.record("train_scorer", 2.0)  # a scoring model's own step
    timings.record("sift", 0.25)
    timings.record("weighted_loss", 0.5)
    assert timings.machinery_seconds == 0.75


def test_each_phase_is_logged_at_info_unless_log_each_is_off(caplog):
    logger = logging.getLogger("neuron_sift.tests.timings")
    with caplog.at_level(logging.INFO, logger=logger.name):
        PhaseTimings(logger).record("sift", 0.125)
        PhaseTimings(logger, log_each=False).record("planning", 0.5)
    assert [r.getMessage() for r in caplog.records] == ["func:sift latency: 0.125000"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=logger.name):
        PhaseTimings(logger).record("sift", 0.125)
    assert caplog.records == []
