"""``benchmarks/device_run.sh``: both transformer workloads (the single-pass language model and
the bert fine-tune) in one script, with the same tables as on the CPU; tested on the CPU at
a tiny size, and its time limit (a task stopped at its share still prints its finished
seeds' tables, and the run says it was stopped)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.subprocess_limits import LIMIT_S

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "device_run.sh"


def _device_run(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--tiny"],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env={**os.environ, "DEVICE_RUN_OUT": str(out), "PYTHON": sys.executable, **env},
    )


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_device_run_runs_the_language_model_and_the_fine_tune_with_their_tables(tmp_path):
    proc = _device_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    lm = _records(tmp_path / "lm" / "runs.jsonl")
    assert {r["seed"] for r in lm} == {0, 1, 2} and {r["backend"] for r in lm} == {"eager"}
    assert "lm-selective-backprop" in {r["arm"] for r in lm}
    bert = _records(tmp_path / "bert" / "runs.jsonl")
    assert {r["task"] for r in bert} == {"bert"} and {r["seed"] for r in bert} == {0, 1, 2}
    assert {"full", "epoch", "sift-probabilistic", "infobatch"} <= {r["arm"] for r in bert}
    assert all(r["device"].startswith("cpu") for r in lm + bert)  # every record names its device
    for r in bert:  # the fine-tune's step costs on the device, in every record
        costs = r["config"]["cost_probe"]
        assert costs["backward_to_forward"] > 0 and 0 < costs["scoring_share_of_step"] < 1
    assert "cost accounting" in proc.stdout  # the language model's table
    assert "bert (eager), 3 seed(s)" in proc.stdout  # the suite's tables for the fine-tune
    assert (tmp_path / "bert" / "summary.jsonl").exists()


@pytest.mark.slow
def test_a_task_stopped_at_its_limit_prints_the_seeds_it_finished_and_the_run_says_so(tmp_path):
    """The limit is met on purpose, not by a slow machine: the Python the script is given runs
    the language model's first seed only and then hangs, as a run would on its second seed
    (the limit leaves a loaded machine several times the seconds the seed takes)."""
    hanging = tmp_path / "python"
    hanging.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ " $* " == *" --summarize "* ]]; then exec "$REAL_PYTHON" "$@"; fi\n'
        '"$REAL_PYTHON" "$@" --seeds 0\n'
        "sleep 120 >/dev/null 2>&1\n"
    )
    hanging.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    proc = _device_run(out, TASKS="lm", LIMIT_S="30", PYTHON=str(hanging), REAL_PYTHON=sys.executable)
    assert proc.returncode == 124, proc.stderr
    assert "stopped at the 30 s limit" in proc.stderr
    assert {r["seed"] for r in _records(out / "lm" / "runs.jsonl")} == {0}
    # the seed's tables twice: the hung run printed them after its seed, the limit's summary again
    assert proc.stdout.count("lm (eager, cpu") == proc.stdout.count("1 seed(s)") == 2
    assert not (out / "bert").exists()


def test_an_unknown_task_is_refused():
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--tiny"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TASKS": "lm vision", "PYTHON": sys.executable},
    )
    assert proc.returncode == 2 and "unknown task vision" in proc.stderr
