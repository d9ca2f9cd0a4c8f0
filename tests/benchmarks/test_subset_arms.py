"""The ``dynamic-random`` and ``seta`` arms (benchmarks/arms/dynamic_random.py,
arms/seta.py, core/planned.py): each obeys its published rule, checked on the pure selection
functions with hand-computed answers, and runs on a tiny task at the cost it should have."""

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import arms
from benchmarks.arms import dynamic_random as dr
from benchmarks.arms import seta
from benchmarks.core import fairness, runner
from benchmarks.core.planned import EPOCH_ARM_SETTING, Phases
from benchmarks.instruments.environment import setup_backend
from benchmarks.tasks import registry
from neuron_sift import EpochSiftConfig

EPOCHS = 8  # warm-up epoch 0, sifted epochs 1-6, annealing epoch 7 (floor(0.125 * 8) = 1)


def test_both_arms_are_registered_as_default_arms_and_the_aggressive_seta_is_not():
    defaults = arms.default_arms()
    assert "dynamic-random" in defaults and "seta" in defaults and "epoch" in defaults
    assert "seta-aggressive" not in defaults and arms.get_arm("seta-aggressive").fn is not None


def test_phases_are_the_epoch_arms():
    """The epoch arm's start rule always holds the first epoch with scores (epoch 1): the
    phases count it with the warm-up; without the rule (SeTa's) only epoch 0 is."""
    config = EpochSiftConfig(**EPOCH_ARM_SETTING)
    assert Phases.of(config, EPOCHS) == Phases(EPOCHS, 2, 7)
    assert Phases.of(config, 32) == Phases(32, 2, 28)
    ruleless = EpochSiftConfig(**{**EPOCH_ARM_SETTING, "start_rank_correlation": None})
    assert Phases.of(ruleless, EPOCHS) == Phases(EPOCHS, 1, 7)
    assert [Phases(EPOCHS, 1, 7).kind(e) for e in (0, 1, 6, 7)] == ["warmup", "sift", "sift", "anneal"]
    assert (
        Phases.of(
            EpochSiftConfig(**{**EPOCH_ARM_SETTING, "warmup_epochs": 0, "start_rank_correlation": None}), 4
        ).warmup
        == 1
    )  # epoch 0 is never sifted


def test_dynamic_random_keeps_the_budgets_count_uniformly_with_weight_one_over_p():
    n = 1001
    order = fairness.EpochOrder(n, seed=0).order
    s = dr.DynamicRandomSampler(n, order, Phases(EPOCHS, 1, 7), kept_share=0.5, seed=0)
    assert s.k == 501 and s.p == pytest.approx(501 / 1001)  # round(500.5), halves up, as the library's budget
    assert s.plan(0) == n and s.indices.tolist() == order(0).tolist()
    assert bool((s.device_weights == 1).all())
    kept_sets = []
    for epoch in range(1, 7):
        assert s.plan(epoch) == 501
        idx = s.indices
        kept = set(idx.tolist())
        assert len(kept) == 501
        assert idx.tolist() == [i for i in order(epoch).tolist() if i in kept]  # the seed's order
        assert torch.allclose(s.device_weights[idx], torch.full((501,), 1001 / 501))
        kept_sets.append(kept)
    assert len({frozenset(k) for k in kept_sets}) == 6  # a new subset every epoch
    assert s.plan(7) == n and bool((s.device_weights == 1).all())  # annealing: all, unit weights
    # uniform: over many sifted epochs every sample is kept about half the time, and the
    # weighted sum of any fixed losses is the full sum in expectation
    many = dr.DynamicRandomSampler(200, fairness.EpochOrder(200, seed=1).order, Phases(402, 1, 402), 0.5, seed=1)
    counts = torch.zeros(200)
    losses = torch.rand(200, generator=torch.Generator().manual_seed(0)) ** 3
    sums = []
    for epoch in range(1, 401):
        keep, w = many.choose(epoch, many.scores)
        assert int(keep.sum()) == 100
        counts += keep.float()
        sums.append(float((losses * w)[keep].sum()))
    assert float(counts.min()) > 200 - 50 and float(counts.max()) < 200 + 50  # binomial(400, 1/2): sd 10
    assert sum(sums) / len(sums) == pytest.approx(float(losses.sum()), rel=0.02)


def test_dynamic_random_draws_depend_on_seed_and_epoch_only():
    phases = Phases(EPOCHS, 1, 7)
    a = dr.DynamicRandomSampler(100, fairness.EpochOrder(100, 0).order, phases, 0.5, seed=4)
    b = dr.DynamicRandomSampler(100, fairness.EpochOrder(100, 0).order, phases, 0.5, seed=4)
    c = dr.DynamicRandomSampler(100, fairness.EpochOrder(100, 0).order, phases, 0.5, seed=5)
    b.plan(1)  # b has planned an epoch before: epoch 3's draw does not depend on it
    assert torch.equal(a.choose(3, a.scores)[0], b.choose(3, b.scores)[0])
    assert not torch.equal(a.choose(3, a.scores)[0], c.choose(3, c.scores)[0])
    assert not torch.equal(a.choose(3, a.scores)[0], a.choose(4, a.scores)[0])


def test_seta_window_size_and_its_cyclic_slide():
    assert seta.window_size(5, 0.9) == 4 and seta.window_size(5, 0.7) == 3 and seta.window_size(5, 1.0) == 5
    assert seta.window_size(5, 0.1) == 1  # at least one group
    assert [list(seta.window_of(t, 5, 0.9)) for t in range(4)] == [[0, 1, 2, 3], [1, 2, 3, 4]] * 2
    assert [list(seta.window_of(t, 5, 0.7)) for t in range(5)] == [
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 4],
        [0, 1, 2],  # the last group reached the hardest: back to the easy end
        [1, 2, 3],
    ]


def test_seta_random_share_is_exact_and_new_for_every_seed_and_step():
    share = seta.random_share(1000, 0.1, seed=3, step=0)
    assert int(share.sum()) == 900 and int(seta.random_share(1000, 0.3, 3, 0).sum()) == 700
    assert torch.equal(share, seta.random_share(1000, 0.1, 3, 0))
    assert not torch.equal(share, seta.random_share(1000, 0.1, 3, 1))
    assert not torch.equal(share, seta.random_share(1000, 0.1, 4, 0))


def _ranks_within(share: torch.Tensor, scores: torch.Tensor) -> dict[int, int]:
    """Rank (0: lowest loss) of every sample of the share among the share, computed plainly."""
    members = sorted(torch.nonzero(share).flatten().tolist(), key=lambda i: float(scores[i]))
    return {i: rank for rank, i in enumerate(members)}


@pytest.mark.parametrize("r, w, per_group, window", [(0.1, 0.9, 180, 4), (0.3, 0.7, 140, 3)])
def test_seta_keeps_the_windows_quantile_groups_of_the_random_share(r, w, per_group, window):
    n, g, seed = 1000, 5, 3
    scores = torch.randperm(n, generator=torch.Generator().manual_seed(9)).float()  # distinct losses
    for step in range(4):
        keep = seta.seta_select(scores, step, seed, r, g, w)
        share = seta.random_share(n, r, seed, step)
        ranks = _ranks_within(share, scores)
        start = step % (g - window + 1)
        expected = {i for i, rank in ranks.items() if start * per_group <= rank < (start + window) * per_group}
        assert set(torch.nonzero(keep).flatten().tolist()) == expected
        assert int(keep.sum()) == window * per_group
        assert torch.equal(keep, seta.seta_select(scores, step, seed, r, g, w))  # a pure function


def test_seta_keeps_unscored_samples_of_the_share_in_every_window():
    n = 1000
    scores = torch.rand(n, generator=torch.Generator().manual_seed(1))
    scores[:100] = float("nan")  # never scored
    for step in range(3):
        keep = seta.seta_select(scores, step, 0, 0.1, 5, 0.9)
        share = seta.random_share(n, 0.1, 0, step)
        assert torch.equal(keep[:100], share[:100])  # every unscored member of the share, whatever the window
        assert not bool((keep & ~share).any())
        scored_in_share = int((share[100:]).sum())
        groups = seta.quantile_groups(torch.nonzero(share & ~torch.isnan(scores)).flatten(), scores, 5)
        assert sum(len(x) for x in groups) == scored_in_share
        assert max(len(x) for x in groups) - min(len(x) for x in groups) <= 1
        assert all(float(scores[a].max()) <= float(scores[b].min()) for a, b in zip(groups, groups[1:]))


def test_seta_sampler_phases_scores_and_unit_weights():
    n = 500
    s = seta.SeTaSampler(n, fairness.EpochOrder(n, 0).order, Phases(EPOCHS, 1, 7), seed=2, r=0.1, g=5, w=0.9)
    assert s.plan(0) == n and s.windows == [None]
    per_sample = torch.rand(n, requires_grad=True)
    loss = s.loss(torch.arange(n), per_sample)
    assert loss.item() == pytest.approx(per_sample.mean().item())  # no reweighting
    assert torch.equal(s.scores, per_sample.detach())
    s.loss(torch.tensor([0, 1]), torch.tensor([float("inf"), 0.5]))
    assert s.scores[0] == per_sample[0].item() and s.scores[1] == 0.5  # non-finite losses are not recorded
    kept = s.plan(1)
    assert torch.equal(
        torch.sort(s.indices).values, torch.nonzero(seta.seta_select(s.scores, 0, 2, 0.1, 5, 0.9)).flatten()
    )
    assert kept == 4 * 90 and s.windows[-1] == [0, 1, 2, 3]
    assert s.plan(2) == 360 and s.windows[-1] == [1, 2, 3, 4]
    assert s.plan(7) == 450 and s.windows[-1] is None  # partial annealing: a random 0.9 share, no window
    assert bool((s.device_weights == 1).all())
    with pytest.raises(ValueError):
        seta.SeTaSampler(n, fairness.EpochOrder(n, 0).order, Phases(EPOCHS, 1, 7), seed=2, r=1.0, g=5, w=0.9)


@pytest.fixture(scope="module")
def tiny_runs():
    """epoch, dynamic-random and seta on the same tiny task and seed."""
    task = replace(
        registry.TASKS["digits"], **{**registry.TINY["digits"], "epochs": EPOCHS, "n_train": 256, "n_test": 64}
    )
    data = registry.make_data(task, None)
    torch.manual_seed(0)
    init = registry.make_model(task).state_dict()
    opts = SimpleNamespace(progress=False, beta=1.0, evals_per_epoch=1)
    backend = setup_backend("eager")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the suite runs: a second thread only spins on a shared machine
    try:
        return {
            a: runner.run_arm(a, arms.get_arm(a).fn, task, data, 0, init, opts, backend)
            for a in ("epoch", "dynamic-random", "seta")
        }
    finally:
        torch.set_num_threads(threads)


def test_dynamic_random_costs_what_the_epoch_arm_costs(tiny_runs):
    ep, rnd = tiny_runs["epoch"], tiny_runs["dynamic-random"]
    assert rnd["kept_per_epoch"] == ep["kept_per_epoch"] == [256, 256] + [128] * 5 + [256]
    assert rnd["steps"] == rnd["planned_steps"] == ep["steps"] == ep["planned_steps"]
    assert rnd["samples_kept"] == rnd["backward_samples"] == ep["samples_kept"]
    assert rnd["scoring_forward_samples"] == 0 and rnd["keep_probability"] == 0.5
    assert rnd["lr_at_end"] < 1e-6 and rnd["epochs"] == EPOCHS


def test_seta_runs_at_its_own_steps_with_the_window_sliding_each_sifted_epoch(tiny_runs):
    res = tiny_runs["seta"]
    assert res["windows"] == [None] + [[0, 1, 2, 3], [1, 2, 3, 4]] * 3 + [None]
    # 256 samples: share round(0.9 * 256) = 230 in quantile groups of 46; a window of 4 holds 184
    assert res["kept_per_epoch"] == [256] + [184] * 6 + [230]
    assert res["samples_kept"] == res["backward_samples"] == sum(res["kept_per_epoch"])
    assert res["steps"] == res["planned_steps"] == sum(-(-k // 32) for k in res["kept_per_epoch"])
    assert res["lr_at_end"] < 1e-6 and res["scoring_forward_samples"] == 0
    assert res["seta"] == {"r": 0.1, "g": 5, "w": 0.9, "window_size": 4}


@pytest.mark.slow
def test_tiny_long_task_runs_the_new_arms_and_summarizes_them(tmp_path):
    import json
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    arm_names = ["full", "epoch", "dynamic-random", "seta", "seta-aggressive"]
    proc = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "suite.py"), "--task", "mnist1d-long", "--tiny", "--seeds", "0,1"]
        + ["--arms", ",".join(arm_names), "--out", str(tmp_path), "--no-progress"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "95% CI (pts)" in proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()]
    assert [(r["task"], r["arm"]) for r in rows] == [("mnist1d-long", a) for a in arm_names]
    for r in rows:
        low, high = r["final_acc_delta_ci95"]
        assert low <= r["final_acc_delta_mean"] <= high and r["seeds"] == 2
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    by_arm = {r["arm"]: r["results"] for r in runs if r["seed"] == 0}
    assert by_arm["dynamic-random"]["kept_per_epoch"] == by_arm["epoch"]["kept_per_epoch"]
    assert by_arm["seta-aggressive"]["samples_kept"] < by_arm["seta"]["samples_kept"] < by_arm["full"]["samples_kept"]
