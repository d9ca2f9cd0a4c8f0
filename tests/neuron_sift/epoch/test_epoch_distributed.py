"""Epoch-level sifting under torchrun + gloo: one plan for all ranks, equal batches, one
collective per epoch, merged scores, synchronised parameters, per-rank exact resume."""

import os

import pytest

from tests.neuron_sift import torchrun
from tests.neuron_sift.torchrun import results

WORKER = os.path.join(os.path.dirname(__file__), "epoch_ddp_worker.py")
EPOCHS = 5  # warm-up, 3 sifted, 1 annealing (anneal_fraction 0.2)


def launch(tmp_path, world, *args, tag="run"):
    return torchrun.launch(WORKER, tmp_path, world, *args, tag=tag)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("budget", [None, 0.4])
def test_one_plan_equal_batches_one_collective_per_epoch(tmp_path, world, budget):
    args = ["--epochs", str(EPOCHS)] + (["--budget", str(budget)] if budget else [])
    runs = results(launch(tmp_path, world, *args), world)
    steps = [r["steps"] for r in runs]
    assert all(s == steps[0] for s in steps), steps
    assert all(r["plans"] == runs[0]["plans"] for r in runs)  # the same global plan every epoch
    assert all(r["params"] == runs[0]["params"] for r in runs)  # DDP kept them identical
    assert all(r["merged"] == runs[0]["merged"] for r in runs)  # the same merged scores
    # every rank trained a disjoint share of each epoch's plan
    start = 0
    for e, n in enumerate(steps[0]):
        per_rank = [set(i for b in r["ids"][start : start + n] for i in b) for r in runs]
        union = set().union(*per_rank)
        assert sum(len(s) for s in per_rank) == len(union)
        if budget and 0 < e < EPOCHS - 1:
            assert len(union) == runs[0]["kept"][e] == (round(budget * 1003) // world) * world
        start += n
    # one all-reduce per epoch that plans from scores (epochs 1..3), none per step
    assert all(r["all_reduce"] == 3 for r in runs), [r["all_reduce"] for r in runs]
    merged = runs[0]["merged"]
    assert sum(1 for v in merged if v >= 0) >= 1003 - world  # the warm-up scored (almost) every sample on some rank


@pytest.mark.slow
def test_each_rank_resumes_its_own_state(tmp_path):
    common = ["--epochs", str(EPOCHS), "--oracle"]
    full = results(launch(tmp_path, 2, *common, "--save-after", "40", tag="full"), 2)
    resumed = results(launch(tmp_path, 2, *common, "--load", tag="full"), 2, resumed=True)
    for r in range(2):
        assert resumed[r]["ids"] == full[r]["ids"][40:]
        assert resumed[r]["plans"][1:] == full[r]["plans"][-(len(resumed[r]["plans"]) - 1) :]
