"""``benchmarks/step_costs.py``: the cost terms of per-batch sifting's cost model, on a suite task."""

import pytest

from benchmarks.step_costs import main


def test_the_probe_reports_each_cost_term_of_a_task_in_its_range():
    (row,) = main(["--task", "digits"])
    assert row["task"] == "digits" and row["batch"] == 32 and row["clock"] == "cpu"
    assert 0 < row["forward_s"] < row["train_step_s"]  # a step is a forward and more
    assert row["backward_to_forward"] > 0
    assert row["scoring_share_of_step"] == pytest.approx(row["scoring_forward_s"] / row["train_step_s"], abs=2e-3)


@pytest.mark.parametrize("argv", [["--task", "nope"], ["--task", ""], ["--threads", "0"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        main(argv)
