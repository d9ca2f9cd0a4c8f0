"""``benchmarks/demo.py`` end to end: a ``--quick`` run as a subprocess, checked through its JSON lines."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "benchmarks" / "demo.py"
ARMS = ["full", "sift-probabilistic", "sift-fixed"]


def run_demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # sys.executable: the interpreter running pytest (the project's virtualenv).
    return subprocess.run(
        [sys.executable, str(DEMO), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_benchmarks_is_not_a_package():
    assert DEMO.is_file()
    assert not (REPO / "benchmarks" / "__init__.py").exists()


def test_help_lists_the_options():
    proc = run_demo("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--epochs", "--seed", "--beta", "--history", "--batch-size", "--quick", "--json"):
        assert option in proc.stdout


def test_rejects_a_bad_beta():
    proc = run_demo("--quick", "--beta", "0")
    assert proc.returncode == 2
    assert "--beta" in proc.stderr


@pytest.mark.slow
def test_quick_run_writes_one_json_line_per_arm(tmp_path):
    out = tmp_path / "demo.jsonl"
    beta = 2.0
    proc = run_demo("--quick", "--beta", str(beta), "--seed", "3", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arm in ARMS:
        assert arm in proc.stdout  # the printed table
    assert "test acc" in proc.stdout

    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert [line["arm"] for line in lines] == ARMS

    configs = [line["config"] for line in lines]
    assert all(c == configs[0] for c in configs), "every arm must run the same config"
    config = configs[0]
    assert config["quick"] is True and config["seed"] == 3 and config["beta_value"] == beta
    assert config["epochs"] >= 1
    for line in lines:
        v = line["versions"]
        assert v["torch"] and v["python"] and v["neuron_sift"]

    expected = 1.0 / (1.0 + beta)
    batch_size = config["batch_size"]
    seen = config["epochs"] * config["n_train"]
    for line in lines:
        r = line["results"]
        assert r["source_samples_seen"] == seen
        assert 0.0 < r["kept_share"] <= 1.0
        assert isinstance(r["test_acc"], float) and 0.0 <= r["test_acc"] <= 1.0
        assert r["test_acc"] > 2.0 / config["n_classes"], "training must beat chance (10 classes)"
        assert r["wall_s"] > 0
        if line["arm"] == "full":
            assert r["kept_share"] == 1.0
            assert r["samples_backpropagated"] == seen
        else:
            # after the delay the kept share is near 1 / (1 + beta) (loose: the model learns meanwhile)
            assert abs(r["kept_share_sifted"] - expected) < 0.1, (line["arm"], r["kept_share_sifted"])
            assert r["expected_kept_share_sifted"] == pytest.approx(expected, abs=1e-4)
            # the delay passes everything, so the overall share is at least the sifted one
            assert r["kept_share"] >= r["kept_share_sifted"]
            assert r["samples_backpropagated"] == r["train_steps"] * batch_size  # every emitted batch is full
            assert r["samples_backpropagated"] < 0.6 * seen
            assert r["samples_kept"] == r["samples_backpropagated"] + r["samples_pending_at_end"]
