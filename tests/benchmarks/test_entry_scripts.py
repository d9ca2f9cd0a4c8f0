"""Every module of ``benchmarks/`` imports and every entry script starts (a script that
cannot be imported cannot be run, and the standalone measurements reach into the loaders'
parts, which no other test would notice changing under them); the ones cheap enough run
at tiny sizes. Also: the suite's command line knows its tasks and its default seeds."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import suite
from benchmarks.tasks import mnist1d, registry
from tests.helpers.subprocess_limits import LIMIT_S

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Found, not listed: a module added to benchmarks/ (at any depth) is covered without touching this file.
MODULES = sorted(_module_name(p) for p in BENCH.rglob("*.py") if "results" not in p.relative_to(BENCH).parts)
ENTRY_SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def fresh(script: str):
    """``benchmarks/<script>`` executed afresh under a name of its own (an import cached by
    another test would prove nothing), as ``python benchmarks/<script>`` would before
    reaching ``main``."""
    spec = importlib.util.spec_from_file_location(f"_entry_{Path(script).stem}", BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scripts_are_found():
    assert {
        "benchmarks.suite",
        "benchmarks.core.runner",
        "benchmarks.core.context",
        "benchmarks.arms",
        "benchmarks.arms.registry",
        "benchmarks.machinery",
        "benchmarks.epoch_machinery",
        "benchmarks.scoring_trace",
    } <= set(MODULES)
    assert {"suite.py", "machinery.py", "epoch_machinery.py", "scoring_trace.py", "memory.py", "scale.py"} <= set(
        ENTRY_SCRIPTS
    )


def test_every_module_imports_in_a_fresh_interpreter():
    """One new interpreter imports them all, in order: what this process imported already
    cannot hide a broken import."""
    code = (
        "import importlib, json, sys, traceback\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "failed = {}\n"
        f"for name in {MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed[name] = traceback.format_exc()\n"
        "print(json.dumps(failed))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S)
    assert proc.returncode == 0, proc.stderr
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{tb}" for name, tb in failed.items())


@pytest.mark.parametrize("script", ENTRY_SCRIPTS)
def test_entry_script_imports_and_answers_help(script, capsys):
    module = fresh(script)
    assert callable(getattr(module, "main", None))
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("script", ENTRY_SCRIPTS)
def test_entry_script_runs_as_a_file_from_another_folder(script, tmp_path):
    """``python benchmarks/<script>.py``, the documented command, also where the checkout is
    not the working folder: the script puts the checkout on the path for ``benchmarks``."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=LIMIT_S
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_suite_runs_as_a_module_of_the_package():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.suite", "--help"], cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: suite.py" in proc.stdout and "--clock" in proc.stdout


def test_epoch_machinery_runs_at_a_tiny_size(tmp_path, capsys):
    module = fresh("epoch_machinery.py")
    out = tmp_path / "epoch_machinery.jsonl"
    args = ["--n", "512", "--repeats", "4", "--e2e-n", "256", "--e2e-repeats", "1"]
    args += ["--planning-n", "4096", "--planning-repeats", "1", "--threads", "0", "--out", str(out)]
    assert module.main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["measure"] for r in rows] == ["per_step_isolated", "per_step_end_to_end"] + ["planning"] * 4
    assert all(0 < r["kept"] <= 4096 for r in rows[2:])
    assert "records:" in capsys.readouterr().out


def test_scale_runs_at_tiny_sizes(tmp_path, capsys):
    """Both paths, two sizes, one and two ranks: a row each, the held bytes per owned sample
    as the docstring states them, the sharded path's collectives independent of N; then the
    rows refitted and replotted from the file alone."""
    module = fresh("scale.py")
    out = tmp_path / "scale.jsonl"
    args = ["--n", "2000", "20000", "--ranks", "1", "2", "--repeats", "1", "--knots", "64", "--out", str(out)]
    assert module.main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["path"], r["n"], r["ranks"]) for r in rows] == [
        (path, n, w) for n in (2000, 20000) for path, w in (("exact", 1), ("sharded", 1), ("sharded", 2))
    ]
    exact = [r for r in rows if r["path"] == "exact"]
    sharded = [r for r in rows if r["path"] == "sharded"]
    # Replicated: the score table, this epoch's weights (the plan's own array; the last epoch's
    # are let go at the opening when no batch of it waits), the ranks' two bool marks, the
    # plan's inclusion and int64 order of half; nothing more once the new epoch records.
    assert all(r["held_bytes_per_owned"] == pytest.approx(18.0, abs=0.01) for r in exact)
    assert all(r["held_steady_bytes_per_owned"] == pytest.approx(18.0, abs=0.01) for r in exact)
    # Sharded: the score table, the plan's weights (the tables' own), the int32 order of half;
    # no inclusion.
    assert all(r["held_bytes_per_owned"] == pytest.approx(10.0, abs=0.01) for r in sharded)
    assert all(r["held_steady_bytes_per_owned"] == pytest.approx(10.0, abs=0.01) for r in sharded)
    assert [r["owned"] for r in sharded] == [2000, 1000, 20000, 10000]
    # The summary gather of every rank's (knots + 2) rows of two float64, then 16 + 8 bytes of scalars.
    assert {r["collective_bytes"] for r in sharded if r["ranks"] == 2} == {(64 + 2) * 16 * 2 + 16 + 8}
    assert all(0 < r["rank_error"] < 1 / 64 for r in sharded)  # the bound quantiles.py states
    assert all(r["kept"] == r["owned"] // 2 for r in rows)
    assert (tmp_path / "scale.png").exists()
    assert "projected at N=1e9" in capsys.readouterr().out

    replot = tmp_path / "again.png"
    assert module.main(["--plot-only", str(out), "--plot", str(replot)]) == 0
    assert replot.exists()
    printed = capsys.readouterr().out
    assert printed.count("projected at N=1e9") == 3 and printed.count("N=     20,000") == 3


@pytest.mark.slow
@pytest.mark.xla
def test_scoring_trace_runs_one_call_of_the_cnn():
    """In its own process: it imports torch-xla, which this process should not."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "scoring_trace.py"), "--calls", "1", "--models", "cnn"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env={**os.environ, "PJRT_DEVICE": "CPU"},
    )
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["model"] == "cnn" and row["identical_losses"] is True


def test_long_task_is_accepted_by_name_and_kept_out_of_all():
    args = suite.parse_args(["--task", "mnist1d-long"])
    assert args.tasks == ["mnist1d-long"]
    task = suite.task_config("mnist1d-long", args)
    main = registry.TASKS["mnist1d"]
    assert task.epochs == registry.LONG_EPOCHS > main.epochs
    assert (task.n_train, task.n_test, task.batch_size, task.lr) == (
        main.n_train,
        main.n_test,
        main.batch_size,
        main.lr,
    )
    assert registry.make_model(task).__class__ is mnist1d.CNN1D
    assert suite.task_config("mnist1d-long", suite.parse_args(["--task", "mnist1d-long", "--tiny"])).epochs < 10
    assert "mnist1d-long" not in suite.parse_args(["--task", "all"]).tasks
    assert suite.parse_args(["--task", "mnist1d,mnist1d-long"]).tasks == ["mnist1d", "mnist1d-long"]


def test_default_seeds_give_the_paired_interval_its_degrees_of_freedom():
    args = suite.parse_args([])
    assert args.seeds == [int(s) for s in suite.DEFAULT_SEEDS.split(",")] and len(args.seeds) >= 3
    assert args.tasks == ["mnist1d"]
    assert {"epoch", "dynamic-random", "seta", "full"} <= set(args.arms) and "seta-aggressive" not in args.arms
