"""Settings every rank must share (``neuron_sift.shared.same_settings``): exact round trips of
each kind of value through the gathered row, and one refusal, raised on every rank, naming
each differing setting with every rank's value."""

import pytest
import torch

from neuron_sift.shared.same_settings import Setting, check_same_settings, decode, differences, encode, settings_row
from tests.neuron_sift.epoch.thread_ranks import run_ranks

VALUES = [None, True, False, 0, -7, 2**63 - 1, 0.3, 1e-300, float("inf"), "sharded"]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_every_kind_of_value_comes_back_exactly(value):
    setting = Setting("x", value, ("replicated", "sharded"))
    back = decode(setting, *encode(setting))
    assert back == value and type(back) is type(value)


def test_values_that_compare_equal_in_python_but_are_not_the_same_setting_differ():
    """``True == 1 == 1.0`` in Python; as settings they are three different values."""
    rows = torch.cat([settings_row([Setting("x", v)]) for v in (True, 1, 1.0)])
    [(_, line)] = differences([Setting("x", None)], rows)
    assert line == "x differs between ranks: rank 0: True; rank 1: 1; rank 2: 1.0"


def test_none_zero_false_and_an_empty_choice_are_four_settings():
    """A setting left unset on one rank (None) and set to 0 on another do not agree."""
    rows = torch.cat([settings_row([Setting("x", v)]) for v in (None, 0, False, 0.0)])
    [(_, line)] = differences([Setting("x", None)], rows)
    assert line == "x differs between ranks: rank 0: None; rank 1: 0; rank 2: False; rank 3: 0.0"


def test_a_string_outside_its_choices_is_a_programming_error():
    with pytest.raises(TypeError, match="cannot compare 'other'"):
        encode(Setting("policy", "other", ("percentile", "below_mean")))


def settings(rank):
    return [
        Setting("n", 400),
        Setting("kept_share", 0.3 if rank == 2 else 0.5),
        Setting("seed", 10 + (rank in (2, 3)), hint="pass seed= the same on every rank"),
        Setting("policy", "below_mean" if rank == 5 else "percentile", ("percentile", "below_mean")),
    ]


def test_every_rank_refuses_naming_each_difference_with_each_ranks_value():
    def rank(ranks):
        try:
            check_same_settings(settings(ranks.rank), ranks, "TheLoader", "Build it the same way everywhere.")
        except ValueError as exc:
            return str(exc), ranks.received_bytes
        return None, ranks.received_bytes

    out = run_ranks(6, rank)
    messages = [m for m, _ in out]
    assert all(m == messages[0] for m in messages)  # every rank raises, with the same message
    message = messages[0]
    assert message is not None and message.startswith("TheLoader was built with different settings")
    assert "kept_share differs between ranks: ranks 0-1, 3-5: 0.5; rank 2: 0.3" in message
    assert "seed differs between ranks: ranks 0-1, 4-5: 10; ranks 2-3: 11" in message
    assert "policy differs between ranks: ranks 0-4: 'percentile'; rank 5: 'below_mean'" in message
    assert "n differs" not in message
    assert message.count("pass seed= the same on every rank") == 1
    assert message.endswith("Build it the same way everywhere.\npass seed= the same on every rank")
    assert all(received == 6 * 16 * 4 for _, received in out)  # one all-gather of 2 int64 per setting


def test_equal_settings_pass_on_every_rank():
    out = run_ranks(3, lambda ranks: check_same_settings(settings(0), ranks, "TheLoader", "") or ranks.received_bytes)
    assert out == [3 * 16 * 4] * 3


def test_one_process_issues_no_collective():
    class NoGroup:
        active = False

        def all_gather_rows(self, t):
            raise AssertionError("a collective without a process group")

    check_same_settings(settings(2), NoGroup(), "TheLoader", "")
