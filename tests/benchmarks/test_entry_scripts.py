"""The benchmark entry scripts import (a script that cannot be imported cannot be run, and
no other test runs the standalone ones), and the suite's command line knows its tasks and
its default seeds."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import suite  # noqa: E402
import tasks  # noqa: E402

ENTRY_SCRIPTS = ("machinery.py", "epoch_machinery.py", "scoring_trace.py", "suite.py", "memory.py")


@pytest.mark.parametrize("script", ENTRY_SCRIPTS)
def test_entry_script_imports(script):
    """Executed afresh under a name of its own (an import cached by another test would prove
    nothing), as ``python benchmarks/<script>`` would before reaching ``main``."""
    spec = importlib.util.spec_from_file_location(f"_entry_{Path(script).stem}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None))


def test_long_task_is_accepted_by_name_and_kept_out_of_all():
    args = suite.parse_args(["--task", "mnist1d-long"])
    assert args.tasks == ["mnist1d-long"]
    task = suite.task_config("mnist1d-long", args)
    main = tasks.TASKS["mnist1d"]
    assert task.epochs == tasks.LONG_EPOCHS > main.epochs
    assert (task.n_train, task.n_test, task.batch_size, task.lr) == (
        main.n_train,
        main.n_test,
        main.batch_size,
        main.lr,
    )
    assert tasks.make_model(task).__class__ is tasks.CNN1D
    assert suite.task_config("mnist1d-long", suite.parse_args(["--task", "mnist1d-long", "--tiny"])).epochs < 10
    assert "mnist1d-long" not in suite.parse_args(["--task", "all"]).tasks
    assert suite.parse_args(["--task", "mnist1d,mnist1d-long"]).tasks == ["mnist1d", "mnist1d-long"]


def test_default_seeds_give_the_paired_interval_its_degrees_of_freedom():
    args = suite.parse_args([])
    assert args.seeds == [int(s) for s in suite.DEFAULT_SEEDS.split(",")] and len(args.seeds) >= 3
    assert args.tasks == ["mnist1d"]
    assert {"epoch", "dynamic-random", "seta", "full"} <= set(args.arms) and "seta-aggressive" not in args.arms
