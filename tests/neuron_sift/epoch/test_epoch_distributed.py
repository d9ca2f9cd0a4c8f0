"""Epoch-level sifting under torchrun + gloo: one plan for all ranks, equal batches, one
collective per epoch, merged scores, synchronised parameters, per-rank exact resume. The
worker (``tests/neuron_sift/ddp_worker.py --mode epoch``) is shared with the per-batch mode's tests."""

import pytest

from tests.neuron_sift import torchrun
from tests.neuron_sift.torchrun import results

EPOCHS = 5  # warm-up, 3 sifted, 1 annealing (anneal_fraction 0.2)


def launch(tmp_path, world, *args, tag="run"):
    return torchrun.launch(torchrun.WORKER, tmp_path, world, "--mode", "epoch", *args, tag=tag)


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
    """Two ranks train a model; each checkpoints (model, optimizer, loader) 40 steps in, 8
    batches into the first sifted epoch, and resumes from its own checkpoint in new
    processes: the same batches, the same weighted losses, the same parameters."""
    common = ["--epochs", str(EPOCHS), "--save-after", "40"]
    full = results(launch(tmp_path, 2, *common, "--resume", "save", tag="run"), 2)
    resumed = results(launch(tmp_path, 2, *common, "--resume", "load", tag="run"), 2, resumed=True)
    for r in range(2):
        assert full[r]["saved_in_epoch"] == [True, "sift"]
        assert resumed[r]["ids"] == full[r]["ids"][40:]
        assert resumed[r]["losses"] == full[r]["losses"][40:]  # the same computation: bitwise equal
        assert resumed[r]["params"] == full[r]["params"]
    assert full[0]["ids"][:40] != full[1]["ids"][:40]  # each rank its own share


@pytest.mark.slow
def test_a_subset_sampler_is_honoured_on_every_rank(tmp_path):
    """A SubsetRandomSampler over two samples in three: no rank reads a sample outside it in
    any epoch (warm-up, sifted, annealing), the shares stay disjoint, and full epochs cover
    the subset (less its remainder over the ranks)."""
    from tests.neuron_sift.ddp_worker import subset_of

    world, budget = 2, 0.4
    args = ["--epochs", str(EPOCHS), "--budget", str(budget), "--subset", "split"]
    runs = results(launch(tmp_path, world, *args), world)
    subset = set(subset_of(1003))
    for r in runs:
        assert set(r["reads"]) <= subset, sorted(set(r["reads"]) - subset)[:10]
        assert sorted(r["reads"]) == sorted(i for b in r["ids"] for i in b)
    steps = runs[0]["steps"]
    assert all(r["steps"] == steps for r in runs)
    start = 0
    for e, n in enumerate(steps):
        per_rank = [set(i for b in r["ids"][start : start + n] for i in b) for r in runs]
        union = set().union(*per_rank)
        assert sum(len(s) for s in per_rank) == len(union) and union <= subset
        expected = len(subset) if e in (0, EPOCHS - 1) else round(budget * len(subset))
        assert len(union) == (expected // world) * world
        start += n


@pytest.mark.slow
def test_a_sampler_that_differs_between_ranks_is_refused_on_every_rank(tmp_path):
    """A per-rank shard of the data as the user's sampler: the loader shards plans itself, so
    every rank refuses it at construction (one all-gather; no rank is left waiting)."""
    runs = results(launch(tmp_path, 2, "--epochs", "2", "--subset", "per-rank"), 2)
    for r in runs:
        assert "different set of samples" in r["refused"] and "same sampler" in r["refused"]
        assert r["reads"] == []


@pytest.mark.slow
def test_a_checkpoint_after_an_epochs_last_batch_resumes_into_its_empty_rest(tmp_path):
    """Saved inside the loop right after epoch 1's last batch (the iteration not ended), the
    loop resumed "at the epoch you were in" takes exactly the uninterrupted run's remaining
    steps on every rank, as many as ``planned_steps()`` said before the resume."""
    common = ["--epochs", "4", "--budget", "0.4", "--samples", "203"]
    full = results(launch(tmp_path, 2, *common, "--boundary", "save", tag="b"), 2)
    resumed = results(launch(tmp_path, 2, *common, "--boundary", "load", tag="b"), 2, resumed=True)
    for r in range(2):
        cut = full[r]["cut"]
        assert cut is not None
        assert resumed[r]["ids"] == full[r]["ids"][cut:]
        assert resumed[r]["planned"] == len(resumed[r]["ids"]) == full[r]["planned"] - cut
        assert resumed[r]["params"] == full[r]["params"]
