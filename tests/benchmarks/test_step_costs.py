"""``benchmarks/step_costs.py``: the cost terms of per-batch sifting's cost model, on a suite task."""

import pytest

from benchmarks.step_costs import main


def test_the_probe_reports_each_cost_term_of_a_task_in_its_range():
    (row,) = main(["--task", "digits"])
    assert row["task"] == "digits" and row["batch"] == 32 and row["clock"] == "cpu"
    assert 0 < row["forward_s"] < row["train_step_s"]  # a step is a forward and more
    assert row["backward_to_forward"] > 0
    assert row["scoring_share_of_step"] == pytest.approx(row["scoring_forward_s"] / row["train_step_s"], abs=2e-3)


def test_the_probe_runs_on_the_backend_asked_and_says_which():
    """A device run probes the fine-tune on its accelerator (``device_run.sh``): the row names
    the backend, the device and the compiler, and the model is compiled (Dynamo built graphs)."""
    from benchmarks.core.compiled import graphs_compiled

    before = graphs_compiled()
    (row,) = main(["--task", "digits", "--backend", "compiled", "--compile-backend", "eager", "--clock", "wall"])
    assert row["backend"] == "compiled" and row["device"].startswith("cpu") and row["clock"] == "wall"
    assert row["versions"]["compile_backend"] == "eager"
    assert graphs_compiled() > before
    assert 0 < row["forward_s"] < row["train_step_s"]


@pytest.mark.parametrize(
    "argv",
    [["--task", "nope"], ["--task", ""], ["--threads", "0"], ["--task", "digits", "--compile-backend", "eager"]],
)
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        main(argv)
