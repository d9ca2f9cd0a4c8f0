"""``benchmarks/suite.py`` (with its parts in ``benchmarks/arms``, ``core``, ``measurement`` and
``report``) and ``benchmarks/machinery.py`` at tiny sizes, so they cannot rot.

The full runs (README's Benchmarks section) are not part of the tests.
"""

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import arms, suite  # suite imports every module of the suite
from benchmarks.arms import frontier, infobatch, per_batch
from benchmarks.core import fairness, runner
from benchmarks.instruments.environment import setup_backend
from benchmarks.instruments.options import default_clock
from benchmarks.tasks import bert, mnist1d, registry
from benchmarks.tasks.data import Data
from tests.helpers.subprocess_limits import LIMIT_S

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
SUITE = BENCH / "suite.py"
MACHINERY = BENCH / "machinery.py"
ARMS = ["full@0.4", "full@0.6", "full@0.8", "full", "uniform", "sift-probabilistic", "sift-fixed", "infobatch"]


def run(script, *args, timeout=LIMIT_S):
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_the_options():
    proc = run(SUITE, "--help")
    assert proc.returncode == 0, proc.stderr
    for option in (
        "--task",
        "--seeds",
        "--arms",
        "--epochs",
        "--beta",
        "--backend",
        "--target-drop",
        "--tiny",
        "--out",
    ):
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
    proc = run(SUITE, "--arms", "full,full@1.5")
    assert proc.returncode == 2 and "full@1.5" in proc.stderr


def test_the_default_clock_is_the_cpu_clock_on_the_hosts_cpu_and_the_wall_clock_on_an_accelerator():
    """The demo prints the README's table (CPU clock) on a loaded machine too; ``--clock`` overrides."""
    assert default_clock([setup_backend("eager")["device_desc"]]) == "cpu"
    assert default_clock(["cpu (x86_64)"]) == default_clock(["xla:CPU"]) == "cpu"  # torch-xla's CPU device too
    for accelerator in ("xla:NEURON", "xla:CUDA", "xla:TPU", "cuda:0"):
        assert default_clock([accelerator]) == "wall"
    assert default_clock(["cpu (x86_64)", "xla:NEURON"]) == "wall"  # records of both: the one clock both have
    with pytest.raises(ValueError):
        default_clock([])
    with pytest.raises(ValueError):
        default_clock([""])
    args = suite.parse_args([])
    assert args.clock is None and not args.clock_given  # chosen by the run's device
    args = suite.parse_args(["--clock", "wall"])
    assert args.clock == "wall" and args.clock_given


def test_registry_default_arms_frontier_and_plugins(tmp_path):
    assert arms.default_arms()[:8] == ARMS
    assert arms.get_arm("full").frontier == 1.0 and arms.get_arm("full@0.4").frontier == 0.4
    assert arms.get_arm("full@0.3").frontier == 0.3  # any fraction, on demand
    with pytest.raises(KeyError):
        arms.get_arm("nope")
    assert [frontier.frontier_epochs(x, 10) for x in (0.4, 0.6, 0.8, 1.0)] == [4, 6, 8, 10]  # not 7 for 0.6
    assert frontier.frontier_epochs(0.25, 10) == 3 and frontier.frontier_epochs(0.01, 10) == 1
    with pytest.raises(ValueError):
        arms.register("full", lambda ctx: {})

    def mine(ctx):
        return {}

    try:
        assert arms.register("test-arm", default=True)(mine) is mine
        assert "test-arm" in arms.default_arms() and arms.get_arm("test-arm").fn is mine
    finally:
        arms.ARMS.pop("test-arm", None)


def test_uniform_loader_plans_its_steps_exactly_and_keeps_the_configured_share():
    n, b, beta, delay, epochs = 1003, 32, 1.0, 4, 3
    data = TensorDataset(torch.randn(n, 3), torch.randint(0, 2, (n,)), torch.arange(n))
    source = DataLoader(data, batch_size=b, shuffle=True, generator=torch.Generator().manual_seed(0))
    loader = per_batch.UniformSubsetLoader(source, beta, delay, seed=0)
    planned = loader.planned_steps(epochs)
    steps = 0
    seen_ids = []
    for _ in range(epochs):
        for x, _y, ids in loader:
            assert x.shape[0] == b  # only full batches
            steps += 1
            seen_ids.append(ids)
    assert steps == planned
    assert loader.seen == epochs * n
    with pytest.raises(RuntimeError):
        loader.planned_steps(1)  # planned from the first epoch only
    # the delay passes 4 batches whole, then round(32 / 2) = 16 of every 32 (and 6 of the last 11)
    per_epoch_kept = (n // b) * 16 + 6
    assert loader.kept == delay * b + epochs * per_epoch_kept - delay * 16
    ids = torch.cat(seen_ids)
    assert ids.unique().numel() > 0.8 * n  # a fresh uniform subset every epoch covers most of the data


def test_a_run_with_the_progress_bar_on_closes_it_whatever_the_schedule():
    """An arm on an epoch-by-epoch schedule never gives the bar a total (the bar then has no
    truth value): the run still ends and closes it."""
    task = replace(registry.TASKS["digits"], **{**registry.TINY["digits"], "epochs": 1, "n_train": 256, "n_test": 64})
    data = registry.make_data(task, None)
    torch.manual_seed(0)
    init = registry.make_model(task).state_dict()
    opts = SimpleNamespace(progress=True, beta=1.0, evals_per_epoch=1)
    for arm in ("full", "infobatch"):
        res = runner.run_arm(arm, arms.get_arm(arm).fn, task, data, 0, init, opts, setup_backend("eager"))
        assert res["epochs"] == 1 and res["steps"] == res["planned_steps"]


def _lrs(sched, opt, steps):
    out = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_cosine_schedule_decays_to_zero_and_never_steps_past_its_end():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    lrs = _lrs(fairness.CosineSchedule(opt, total_steps=10), opt, 12)
    assert lrs[0] == 2.0 and lrs[5] == pytest.approx(1.0) and lrs[10] == pytest.approx(0.0, abs=1e-12)
    assert lrs[12] == lrs[10]  # clamped
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    assert [fairness.cosine_factor(10)(i) for i in (0, 10, 25)] == [1.0, pytest.approx(0.0, abs=1e-12), lrs[10] / 2]


def test_warmup_rises_linearly_then_decays_by_cosine_over_the_rest_of_the_run():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    lrs = _lrs(fairness.CosineSchedule(opt, total_steps=20, warmup=0.1), opt, 22)
    assert lrs[:3] == [0.0, pytest.approx(1.0), pytest.approx(2.0)]  # 2 warm-up steps of 20
    assert lrs[11] == pytest.approx(1.0) and lrs[20] == pytest.approx(0.0, abs=1e-12) and lrs[22] == lrs[20]
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:], strict=False))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = fairness.CosineSchedule(opt, epochs=2, warmup=0.25)  # by epochs: a quarter of the run, half an epoch
    sched.begin_epoch(4)
    assert _lrs(sched, opt, 4) == [
        0.0,
        pytest.approx(0.5),
        pytest.approx(1.0),
        pytest.approx(0.5 * (1 + math.cos(math.pi / 6))),
        pytest.approx(0.5 * (1 + math.cos(math.pi / 3))),
    ]
    with pytest.raises(ValueError):
        fairness.CosineSchedule(opt, total_steps=10, warmup=1.0)
    for neither_or_both in ({}, {"total_steps": 10, "epochs": 2}):  # by steps or by epochs, one of the two
        with pytest.raises(ValueError):
            fairness.CosineSchedule(opt, **neither_or_both)


def test_epoch_schedule_spends_each_epoch_whatever_its_length_and_ends_at_zero():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = fairness.CosineSchedule(opt, epochs=4)
    lrs = []
    for steps in (10, 3, 7, 5):  # epoch lengths known only when each epoch is planned
        sched.begin_epoch(steps)
        lrs += _lrs(sched, opt, steps)[1:]
    assert lrs[9] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))  # end of epoch 1: a quarter of the way
    assert lrs[12] == pytest.approx(0.5)  # end of epoch 2: half way
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    assert sched.planned == 25


def test_epoch_order_is_the_same_per_seed_and_epoch_and_differs_between_them():
    a, b = fairness.EpochOrder(50, seed=3), fairness.EpochOrder(50, seed=3)
    first, second = list(a), list(a)
    assert first == list(b) == a.order(0).tolist() and second == list(b) == a.order(1).tolist()
    assert sorted(first) == list(range(50)) and first != second
    assert fairness.EpochOrder(50, seed=4).order(0).tolist() != first


def test_mnist1d_is_generated_locally_without_the_network(monkeypatch, tmp_path):
    import requests

    def no_network(*args, **kwargs):
        raise AssertionError("the benchmark must not download anything")

    monkeypatch.setattr(requests, "get", no_network)
    data = mnist1d.mnist1d_data(400, 100, cache=tmp_path)
    assert data.x_train.shape == (400, 40) and data.x_test.shape == (100, 40)
    assert set(data.y_train.tolist()) <= set(range(10))
    again = mnist1d.mnist1d_data(400, 100, cache=tmp_path)  # from the cache, identical
    assert torch.equal(again.x_train, data.x_train) and torch.equal(again.y_test, data.y_test)


def test_label_flips_change_exactly_the_requested_share():
    y = torch.arange(1000) % 10
    flipped, mask = registry._flip_labels(y, 0.2, 10, seed=0)
    assert int(mask.sum()) == 200
    assert bool((flipped[mask] != y[mask]).all()) and bool((flipped[~mask] == y[~mask]).all())


def test_keyword_sequences_label_is_the_most_frequent_keyword_and_usually_by_one():
    x, y = bert.keyword_sequences(400, seed=0)
    assert x.shape == (400, bert.BERT_LEN)
    leads = []
    for row, label in zip(x, y, strict=True):
        cls = bert.cue_class(row)
        counts = [(cls == k).sum().item() for k in range(bert.BERT_CLASSES)]
        assert counts[label] == max(counts) and counts.count(max(counts)) == 1
        leads.append(counts[label] - sorted(counts)[-2])
    assert 0.7 < leads.count(1) / len(leads) < 0.95  # three in four by construction, plus chance
    assert x[:, 0].eq(0).all() and int(x.max()) < bert.BERT_VOCAB
    cues = x[(x >= 1) & (x <= bert.BERT_CUES)]
    ranks = (cues - 1) // bert.BERT_CLASSES
    assert (ranks == 0).float().mean() > 5 * (ranks == 20).float().mean()  # Zipf: frequent words, a long tail


def test_redundant_data_is_mostly_jittered_copies_of_a_small_pool(tmp_path):
    n, nt = 4000, 100
    base = Data(
        torch.randn(n, 40),
        torch.randint(0, 10, (n,)),
        torch.randn(nt, 40),
        torch.randint(0, 10, (nt,)),
        torch.zeros(n, dtype=torch.bool),
        10,
    )
    red = mnist1d.make_redundant(base)
    assert red.x_train.shape == base.x_train.shape and torch.equal(red.x_test, base.x_test)
    # each training sample is within jitter of one original, with that original's label
    d = torch.cdist(red.x_train, base.x_train)
    nearest = d.argmin(dim=1)
    assert bool((d.min(dim=1).values < 6 * mnist1d.REDUNDANT_JITTER * 40**0.5).all())
    assert torch.equal(red.y_train, base.y_train[nearest])
    exact = d.min(dim=1).values < 0.1  # copies: about 0.05 * sqrt(40) = 0.3 away (cdist is not exact at 0)
    assert int(exact.sum()) == round(mnist1d.REDUNDANT_DISTINCT * n)  # the distinct quarter, unchanged
    sources = nearest[~exact].unique()
    assert len(sources) == round(mnist1d.REDUNDANT_POOL * n)  # copies of a pool of 100 originals
    assert nearest.unique().numel() == round(mnist1d.REDUNDANT_DISTINCT * n)


def test_infobatch_prunes_below_mean_at_the_published_rate_and_reweights_the_survivors():
    n, epochs = 20_000, 8
    order = fairness.EpochOrder(n, seed=0).order
    s = infobatch.InfoBatchSampler(n, epochs, order, seed=0)
    assert s.plan(0) == n and s.indices.tolist() == order(0).tolist()  # nothing scored yet: all kept, in order
    assert bool((s.weights == 1).all())
    scores = torch.rand(n) ** 3  # skewed: 1/4 mean, about 63% below it
    half = torch.arange(n // 2)
    s.record(half, scores[half])  # only half scored: the rest is kept whatever happens
    kept = s.plan(1)
    below = torch.zeros(n, dtype=torch.bool)
    below[half] = scores[half] < scores[half].mean()
    in_epoch = torch.zeros(n, dtype=torch.bool)
    in_epoch[s.indices] = True
    assert bool(in_epoch[n // 2 :].all()) and bool(in_epoch[half][~below[half]].all())
    survived = in_epoch[below].float().mean().item()
    assert abs(survived - 0.5) < 0.03  # pruned with probability r = 0.5
    assert kept == n - int(below.sum()) + int(in_epoch[below].sum())
    assert bool((s.weights[below & in_epoch] == 2.0).all()) and bool((s.weights[~below] == 1.0).all())
    assert s.indices.tolist() == [i for i in order(1).tolist() if in_epoch[i]]  # the seed's order, filtered
    # unbiased: the expected weighted sum over the kept samples is the full sum
    s.record(torch.arange(n), scores)
    sums = []
    for _ in range(20):
        s.plan(2)
        sums.append(float((scores[s.indices] * s.weights[s.indices]).sum()))
    assert abs(sum(sums) / len(sums) / float(scores.sum()) - 1) < 0.01
    # annealing: epochs >= 0.875 * 8 = 7 train on all data, unit weights
    assert s.plan(6) < n and s.plan(7) == n and bool((s.weights == 1).all())


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_records(records, task, seeds, backend):
    assert [(r["seed"], r["arm"]) for r in records] == [(s, a) for s in seeds for a in ARMS]
    for r in records:
        assert r["task"] == task and r["backend"] == backend
        assert r["versions"]["torch"] and r["versions"]["neuron_sift"] and r["device"]
        assert r["config"]["seeds"] == seeds and r["config"]["epochs"] >= 1
        probe = r["config"]["cost_probe"]  # the task's step costs on the run's device, in every record
        assert probe == records[0]["config"]["cost_probe"] and 0 < probe["scoring_share_of_step"]
        assert probe["backward_to_forward"] > 0 and probe["clock"] == r["results"]["clock"]
    cfg = records[0]["config"]
    n, epochs = cfg["n_train"], cfg["epochs"]
    for seed in seeds:
        runs = {r["arm"]: r["results"] for r in records if r["seed"] == seed}
        full = runs["full"]
        for arm, res in runs.items():
            frac = arms.get_arm(arm).frontier
            arm_epochs = frontier.frontier_epochs(frac, epochs) if frac else epochs
            assert res["epochs"] == arm_epochs
            assert res["target_acc"] == pytest.approx(full["final_test_acc"] - 0.005, abs=1e-6)
            assert 0.0 <= res["final_test_acc"] <= 1.0 and res["final_test_acc"] > 0.2, (arm, res["final_test_acc"])
            assert res["wall_s"] > 0 and res["source_samples_seen"] == arm_epochs * n
            assert res["backward_samples"] == res["training_forward_samples"]
            assert res["forward_samples"] == res["scoring_forward_samples"] + res["training_forward_samples"]
            curve = res["curve"]
            assert curve[0]["wall_s"] == 0.0 and curve[-1]["test_acc"] == res["final_test_acc"]
            assert [p["wall_s"] for p in curve] == sorted(p["wall_s"] for p in curve)
            assert curve[-1]["wall_s"] == pytest.approx(res["wall_s"], abs=1e-3)
            assert curve[-1]["cpu_s"] == pytest.approx(res["cpu_s"], abs=1e-3) and res["cpu_s"] > 0
            assert [p["cpu_s"] for p in curve] == sorted(p["cpu_s"] for p in curve)
            assert len(curve) >= arm_epochs * cfg["evals_per_epoch"]
            if res["time_to_target_s"] is not None:
                assert res["time_to_target_s"] <= res[{"wall": "wall_s", "cpu": "cpu_s"}[res["clock"]]] + 1e-9
            assert res["steps"] <= res["planned_steps"] + 4
            if res["time_to_target_s"] is not None and full["time_to_target_s"] is not None:
                assert res["paired"]["predicted_speedup"] > 0
            assert res["lr_at_end"] < 1e-3 * cfg["lr"] or arm == "sift-probabilistic"  # decayed to its own end
            p = res["paired"]
            assert p["final_acc_delta"] == pytest.approx(100 * (res["final_test_acc"] - full["final_test_acc"]))
            if frac:
                assert p["iso_time_gain"] == pytest.approx(0.0, abs=1e-9)  # a frontier point itself
                assert res["backward_samples"] == arm_epochs * n and res["steps"] == res["planned_steps"]
        assert full["kept_share"] == 1.0 and full["backward_samples"] == epochs * n
        assert full["scoring_forward_samples"] == 0
        assert full["time_to_target_s"] is not None and full["paired"]["speedup_vs_full"] == 1.0
        uni, fixed, prob, ib = runs["uniform"], runs["sift-fixed"], runs["sift-probabilistic"], runs["infobatch"]
        assert uni["steps"] == uni["planned_steps"] and fixed["steps"] == fixed["planned_steps"]
        assert uni["kept_share"] == fixed["kept_share"]  # same configured share, exactly
        assert uni["scoring_forward_samples"] == 0
        assert abs(prob["kept_share"] - fixed["kept_share"]) < 0.15
        for res in (fixed, prob):
            delayed = res["source_batches_delayed"] * cfg["batch_size"]
            assert res["scoring_forward_samples"] == epochs * n - delayed
            assert res["backward_samples"] < 0.8 * epochs * n
            assert res["machinery_s"] > 0
        assert ib["scoring_forward_samples"] == 0 and ib["steps"] == ib["planned_steps"]
        assert ib["backward_samples"] == ib["samples_kept"] == sum(ib["kept_per_epoch"]) < epochs * n
        assert ib["kept_per_epoch"][0] == n  # nothing scored before the first epoch


@pytest.mark.slow
def test_tiny_suite_runs_every_arm_and_writes_records_summary_and_plot(tmp_path):
    proc = run(
        SUITE,
        "--task",
        "digits",
        "--tiny",
        "--epochs",
        "3",
        "--seeds",
        "0,1",
        "--out",
        str(tmp_path),
        "--no-progress",
        "--arms",
        ",".join(ARMS),
    )  # the arms of the epoch-level and subset plug-ins aside
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arm in ARMS:
        assert arm in proc.stdout
    # on the host's CPU, no --clock: the CPU clock (a loaded machine prints the idle machine's table)
    assert "times on the cpu clock" in proc.stdout and "times: the cpu clock (the default" in proc.stdout
    head = proc.stdout[proc.stdout.index("runs in") :]
    assert head.index("speedup vs frontier") < head.index("time to target s")  # the headline table first
    records = _records(tmp_path / "runs.jsonl")
    _check_records(records, "digits", [0, 1], "eager")
    png = tmp_path / "accuracy_vs_time.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = _records(tmp_path / "summary.jsonl")
    assert [r["arm"] for r in rows] == ARMS
    for r in rows:
        assert r["task"] == "digits" and r["backend"] == "eager" and r["seeds"] == 2 and 0 <= r["reached"] <= 2
        for key in (
            "speedup_vs_full",
            "speedup_vs_frontier",
            "iso_time_gain",
            "final_acc",
            "final_acc_delta",
            "total_wall_s",
            "bwd_samples",
            "kept_share",
        ):
            assert key in r and key + "_min" in r and key + "_max" in r
            if r[key] is not None:
                assert r[key + "_min"] <= r[key] <= r[key + "_max"]
            else:
                assert r["reached"] == 0 and key.startswith("speedup")
        assert r["commit"] == records[0]["versions"]["commit"]
        low, high = r["final_acc_delta_ci95"]  # two seeds: an interval around the paired mean
        assert low <= r["final_acc_delta_mean"] <= high
    full = next(r for r in rows if r["arm"] == "full")
    assert full["reached"] == 2 and full["speedup_vs_full"] == 1.0 and full["final_acc_delta"] == 0.0
    # --summarize reprints the tables (and rewrites the summary) from the records
    proc = run(
        SUITE,
        "--summarize",
        str(tmp_path / "runs.jsonl"),
        "--markdown",
        "--plot",
        str(tmp_path / "again.png"),
        "--summary",
        str(tmp_path / "again.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "| infobatch |" in proc.stdout and (tmp_path / "again.png").is_file()
    assert _records(tmp_path / "again.jsonl") == rows  # the records' CPU device: the CPU clock again
    # the same records on the wall-clock (--clock overrides): the same accuracies, reached counts from wall_s
    proc = run(
        SUITE,
        "--summarize",
        str(tmp_path / "runs.jsonl"),
        "--clock",
        "wall",
        "--plot",
        str(tmp_path / "wall.png"),
        "--summary",
        str(tmp_path / "wall.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "times on the wall clock" in proc.stdout and "times: the wall clock (--clock)" in proc.stdout
    wall_rows = _records(tmp_path / "wall.jsonl")
    assert all(r["clock"] == "wall" for r in wall_rows) and all(r["clock"] == "cpu" for r in rows)
    assert all(r["results"]["clock"] == "cpu" for r in records)
    assert [r["final_acc"] for r in wall_rows] == [r["final_acc"] for r in rows]


@pytest.mark.slow
def test_tiny_noisy_task_reports_the_mislabeled_share(tmp_path):
    proc = run(
        SUITE,
        "--task",
        "mnist1d-noisy",
        "--tiny",
        "--epochs",
        "1",
        "--seeds",
        "1",
        "--n-train",
        "1000",
        "--arms",
        "full,uniform,sift-fixed,infobatch",
        "--out",
        str(tmp_path),
        "--no-progress",
    )
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
def test_tiny_redundant_and_bert_tasks_run_with_any_frontier_fraction(tmp_path):
    proc = run(
        SUITE,
        "--task",
        "mnist1d-redundant,bert",
        "--tiny",
        "--seeds",
        "0",
        "--arms",
        "full@0.5,full,infobatch",
        "--out",
        str(tmp_path),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _records(tmp_path / "summary.jsonl")
    assert [(r["task"], r["arm"]) for r in rows] == [
        (t, a) for t in ("mnist1d-redundant", "bert") for a in ("full@0.5", "full", "infobatch")
    ]
    records = _records(tmp_path / "runs.jsonl")
    bert_models = {r["config"]["model"] for r in records if r["task"] == "bert"}
    assert bert_models == {registry.model_description(registry.TASKS["bert"])}


@pytest.mark.slow
@pytest.mark.xla
def test_tiny_suite_on_xla_records_compiles_and_host_reads(tmp_path):
    pytest.importorskip("torch_xla", reason="torch-xla not installed (CI installs it: pip install -e .[xla])")
    proc = run(
        SUITE,
        "--task",
        "digits",
        "--tiny",
        "--seeds",
        "0",
        "--backend",
        "xla",
        "--out",
        str(tmp_path),
        "--no-progress",
        "--arms",
        ",".join(ARMS),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(tmp_path / "runs.jsonl")
    _check_records(records, "digits", [0], "xla")
    for r in records:
        res = r["results"]
        assert r["device"].startswith("xla:")
        assert res["clock"] == ("cpu" if r["device"] == "xla:CPU" else "wall")  # its CPU device is the host's CPU
        assert res["xla_compiles"] >= 0 and res["xla_host_reads_per_step"] >= 0
        per_step = res["xla_host_reads_per_step"]
        assert res["xla_host_reads"] == pytest.approx(per_step * res["steps"], abs=0.01 * res["steps"])
    by_arm = {r["arm"]: r["results"] for r in records}
    # the untimed warm-up compiled the plain step; the frontier arms reuse its graphs (the last batch's shape aside)
    assert all(by_arm[a]["xla_compiles"] <= 2 for a in ("full@0.4", "full@0.6", "full@0.8", "full"))
    # infobatch reads its scores back once per epoch, to plan the next; never per step
    assert by_arm["infobatch"]["xla_host_reads"] <= by_arm["infobatch"]["epochs"]
    # fixed mode reads nothing back per source batch; probabilistic mode reads two scalars per source batch
    assert by_arm["sift-fixed"]["xla_host_reads"] < by_arm["sift-probabilistic"]["xla_host_reads"]


@pytest.mark.slow
def test_tiny_machinery_run(tmp_path):
    out = tmp_path / "m.jsonl"
    proc = run(
        MACHINERY,
        "--backends",
        "eager",
        "--batch-sizes",
        "32,64",
        "--histories",
        "500,2048",
        "--batches",
        "3",
        "--repeats",
        "1",
        "--json",
        str(out),
    )
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
    import neuron_sift.engine.step as step_module
    from benchmarks import machinery
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
        machinery.machinery_seconds(
            16, 64, "fixed", "pairwise", torch.device("cpu"), lambda: None, batches=2, repeats=1
        )
        assert calls == {"host": 0, "torch": 4}  # warm-up epoch + 1 timed epoch, 2 source batches each
        machinery.machinery_seconds(16, 64, "fixed", "host", torch.device("cpu"), lambda: None, batches=2, repeats=1)
        assert calls["host"] == 4
    finally:
        sifter_module.sift_step_cpu, sifter_module.sift_step = real_host, real_torch
    # the benchmark restores the engine's kernel when it is done
    assert step_module.percentile_rank_auto is percentile_rank_auto
    assert math.isfinite(machinery.TrainStep(16, torch.device("cpu"), lambda: None).seconds(2))
