"""``benchmarks/suite.py`` and ``benchmarks/machinery.py`` at tiny sizes, so they cannot rot.

The full runs (README's Benchmarks section) are not part of the tests.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
SUITE = BENCH / "suite.py"
MACHINERY = BENCH / "machinery.py"
ARMS = ["full", "uniform", "sift-probabilistic", "sift-fixed"]

sys.path.insert(0, str(BENCH))
import suite  # noqa: E402


def run(script, *args, timeout=180):
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_the_options():
    proc = run(SUITE, "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--task", "--seeds", "--arms", "--epochs", "--beta", "--backend", "--target-drop", "--tiny", "--out"):
        assert option in proc.stdout
    proc = run(MACHINERY, "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--batch-sizes", "--histories", "--backends", "--engines", "--repeats"):
        assert option in proc.stdout


def test_rejects_bad_arguments():
    proc = run(SUITE, "--task", "imagenet")
    assert proc.returncode == 2 and "--task" in proc.stderr
    proc = run(SUITE, "--arms", "uniform,sift-fixed")
    assert proc.returncode == 2 and "full" in proc.stderr


def test_uniform_loader_plans_its_steps_exactly_and_keeps_the_configured_share():
    n, b, beta, delay, epochs = 1003, 32, 1.0, 4, 3
    data = TensorDataset(torch.randn(n, 3), torch.randint(0, 2, (n,)), torch.arange(n))
    source = DataLoader(data, batch_size=b, shuffle=True, generator=torch.Generator().manual_seed(0))
    loader = suite.UniformSubsetLoader(source, beta, delay, seed=0)
    planned = loader.planned_steps(epochs)
    steps = 0
    seen_ids = []
    for _ in range(epochs):
        for x, y, ids in loader:
            assert x.shape[0] == b  # only full batches
            steps += 1
            seen_ids.append(ids)
    assert steps == planned
    assert loader.seen == epochs * n
    # the delay passes 4 batches whole, then round(32 / 2) = 16 of every 32 (and 6 of the last 11)
    per_epoch_kept = (n // b) * 16 + 6
    assert loader.kept == delay * b + epochs * per_epoch_kept - delay * 16
    ids = torch.cat(seen_ids)
    assert ids.unique().numel() > 0.8 * n  # a fresh uniform subset every epoch covers most of the data


def test_cosine_schedule_decays_to_zero_and_never_steps_past_its_end():
    f = suite.cosine_factor(10)
    assert f(0) == 1.0
    assert f(10) == pytest.approx(0.0, abs=1e-12)
    assert f(25) == f(10)  # clamped
    assert all(f(i) >= f(i + 1) for i in range(12))


def test_time_to_target_takes_the_first_point_at_or_above_the_target():
    curve = [{"wall_s": 0.0, "test_acc": 0.1}, {"wall_s": 2.0, "test_acc": 0.9}, {"wall_s": 3.0, "test_acc": 0.95}]
    assert suite.time_to_target(curve, 0.9) == 2.0
    assert suite.time_to_target(curve, 0.96) is None


def test_mnist1d_is_generated_locally_without_the_network(monkeypatch, tmp_path):
    import requests

    def no_network(*args, **kwargs):
        raise AssertionError("the benchmark must not download anything")

    monkeypatch.setattr(requests, "get", no_network)
    data = suite.mnist1d_data(400, 100, cache=tmp_path)
    assert data.x_train.shape == (400, 40) and data.x_test.shape == (100, 40)
    assert set(data.y_train.tolist()) <= set(range(10))
    again = suite.mnist1d_data(400, 100, cache=tmp_path)  # from the cache, identical
    assert torch.equal(again.x_train, data.x_train) and torch.equal(again.y_test, data.y_test)


def test_label_flips_change_exactly_the_requested_share():
    y = torch.arange(1000) % 10
    flipped, mask = suite._flip_labels(y, 0.2, 10, seed=0)
    assert int(mask.sum()) == 200
    assert bool((flipped[mask] != y[mask]).all()) and bool((flipped[~mask] == y[~mask]).all())


def test_keyword_sequences_label_is_the_most_frequent_keyword():
    x, y = suite.keyword_sequences(200, seed=0)
    assert x.shape == (200, suite.BERT_LEN)
    for row, label in zip(x, y):
        counts = [(row == k + 1).sum().item() for k in range(suite.BERT_CLASSES)]
        assert counts[label] == max(counts) and counts.count(max(counts)) == 1


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_records(records, task, seeds, backend):
    assert [(r["seed"], r["arm"]) for r in records] == [(s, a) for s in seeds for a in ARMS]
    for r in records:
        assert r["task"] == task and r["backend"] == backend
        assert r["versions"]["torch"] and r["versions"]["neuron_sift"] and r["device"]
        assert r["config"]["seeds"] == seeds and r["config"]["epochs"] >= 1
    cfg = records[0]["config"]
    n, epochs = cfg["n_train"], cfg["epochs"]
    for seed in seeds:
        runs = {r["arm"]: r["results"] for r in records if r["seed"] == seed}
        full = runs["full"]
        for arm, res in runs.items():
            assert res["target_acc"] == pytest.approx(full["final_test_acc"] - 0.005, abs=1e-6)
            assert 0.0 <= res["final_test_acc"] <= 1.0 and res["final_test_acc"] > 0.2, (arm, res["final_test_acc"])
            assert res["wall_s"] > 0 and res["source_samples_seen"] == epochs * n
            assert res["backward_samples"] == res["training_forward_samples"]
            assert res["forward_samples"] == res["scoring_forward_samples"] + res["training_forward_samples"]
            curve = res["curve"]
            assert curve[0]["wall_s"] == 0.0 and curve[-1]["test_acc"] == res["final_test_acc"]
            assert [p["wall_s"] for p in curve] == sorted(p["wall_s"] for p in curve)
            assert curve[-1]["wall_s"] == pytest.approx(res["wall_s"], abs=1e-3)
            if res["time_to_target_s"] is not None:
                assert res["time_to_target_s"] <= res["wall_s"] + 1e-9
            assert res["steps"] <= res["planned_steps"] + 4
        assert full["kept_share"] == 1.0 and full["backward_samples"] == epochs * n and full["scoring_forward_samples"] == 0
        assert full["steps"] == full["planned_steps"]
        assert full["time_to_target_s"] is not None  # the full arm reaches its own final accuracy - 0.5
        uni, fixed, prob = runs["uniform"], runs["sift-fixed"], runs["sift-probabilistic"]
        assert uni["steps"] == uni["planned_steps"] and fixed["steps"] == fixed["planned_steps"]
        assert uni["kept_share"] == fixed["kept_share"]  # same configured share, exactly
        assert uni["scoring_forward_samples"] == 0
        assert abs(prob["kept_share"] - fixed["kept_share"]) < 0.15
        for res in (fixed, prob):
            delayed = res["source_batches_delayed"] * cfg["batch_size"]
            assert res["scoring_forward_samples"] == epochs * n - delayed
            assert res["backward_samples"] < 0.8 * epochs * n
            assert res["machinery_s"] > 0


@pytest.mark.slow
def test_tiny_suite_runs_every_arm_and_writes_records_and_plot(tmp_path):
    proc = run(SUITE, "--task", "digits", "--tiny", "--seeds", "0", "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arm in ARMS:
        assert arm in proc.stdout
    assert "time to target" in proc.stdout and "final test acc" in proc.stdout
    records = _records(tmp_path / "runs.jsonl")
    _check_records(records, "digits", [0], "eager")
    png = tmp_path / "accuracy_vs_time.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --summarize reprints the table from the records
    proc = run(SUITE, "--summarize", str(tmp_path / "runs.jsonl"), "--markdown", "--plot", str(tmp_path / "again.png"))
    assert proc.returncode == 0, proc.stderr
    assert "| sift-fixed |" in proc.stdout and (tmp_path / "again.png").is_file()


@pytest.mark.slow
def test_tiny_noisy_task_reports_the_mislabeled_share(tmp_path):
    proc = run(SUITE, "--task", "mnist1d-noisy", "--tiny", "--epochs", "1", "--seeds", "1", "--n-train", "1000",
               "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(tmp_path / "runs.jsonl")
    for r in records:
        res = r["results"]
        assert res["mislabeled_share_data"] == pytest.approx(0.2, abs=1e-3)
        assert 0.0 < res["mislabeled_share_trained"] < 1.0
        assert len(res["mislabeled_share_trained_per_epoch"]) == 1
    full = next(r["results"] for r in records if r["arm"] == "full")
    assert full["mislabeled_share_trained"] == pytest.approx(0.2, abs=1e-3)  # every sample, once


@pytest.mark.slow
@pytest.mark.xla
def test_tiny_suite_on_xla_records_compiles_and_host_reads(tmp_path):
    pytest.importorskip("torch_xla", reason="torch-xla not installed (CI installs it: pip install -e .[xla])")
    proc = run(SUITE, "--task", "digits", "--tiny", "--seeds", "0", "--backend", "xla", "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(tmp_path / "runs.jsonl")
    _check_records(records, "digits", [0], "xla")
    for r in records:
        res = r["results"]
        assert r["device"].startswith("xla")
        assert res["xla_compiles"] >= 0 and res["xla_host_reads_per_step"] >= 0
        assert res["xla_host_reads"] == pytest.approx(res["xla_host_reads_per_step"] * res["steps"], abs=0.01 * res["steps"])
    by_arm = {r["arm"]: r["results"] for r in records}
    assert by_arm["full"]["xla_compiles"] >= 1  # later arms reuse graphs compiled in the same process
    # fixed mode reads nothing back per source batch; probabilistic mode reads two scalars per source batch
    assert by_arm["sift-fixed"]["xla_host_reads"] < by_arm["sift-probabilistic"]["xla_host_reads"]


@pytest.mark.slow
def test_tiny_machinery_run(tmp_path):
    out = tmp_path / "m.jsonl"
    proc = run(MACHINERY, "--backends", "eager", "--batch-sizes", "32,64", "--histories", "500,2048",
               "--batches", "3", "--repeats", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r["results"] for r in _records(out)]
    assert [(r["batch_size"], r["history"]) for r in rows] == [(32, 500), (32, 2048), (64, 500), (64, 2048)]
    for r in rows:
        assert r["backend"] == "eager" and r["step_ms"] > 0
        for k in ("pairwise", "torch", "host"):
            assert r[f"{k}_ms"] >= 0 and r[f"{k}_host_ms"] > 0 and r[f"{k}_step_ms"] > 0
            assert r[f"{k}_share"] == pytest.approx(r[f"{k}_ms"] / r[f"{k}_step_ms"], rel=0.02, abs=1e-3)
    assert "% of step" in proc.stdout
    # each engine really runs: the torch step on the CPU for pairwise/torch, the host step for host
    import machinery
    import neuron_sift.engine.step as step_module
    from neuron_sift.engine import cpu_step
    from neuron_sift.kernels.percentile import percentile_rank_auto

    calls = {"host": 0, "torch": 0}
    real_host, real_torch = cpu_step.sift_step_cpu, step_module.sift_step

    def count(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    import neuron_sift.engine.sifter as sifter_module

    try:
        sifter_module.sift_step_cpu = count("host", real_host)
        sifter_module.sift_step = count("torch", real_torch)
        machinery.machinery_seconds(16, 64, "fixed", "pairwise", torch.device("cpu"), lambda: None, batches=2, repeats=1)
        assert calls == {"host": 0, "torch": 4}  # warm-up epoch + 1 timed epoch, 2 source batches each
        machinery.machinery_seconds(16, 64, "fixed", "host", torch.device("cpu"), lambda: None, batches=2, repeats=1)
        assert calls["host"] == 4
    finally:
        sifter_module.sift_step_cpu, sifter_module.sift_step = real_host, real_torch
    # the benchmark restores the engine's kernel when it is done
    assert step_module.percentile_rank_auto is percentile_rank_auto
    assert math.isfinite(machinery.TrainStep(16, torch.device("cpu"), lambda: None).seconds(2))
