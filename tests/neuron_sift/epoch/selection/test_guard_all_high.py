"""The noise guard where many scores tie: all losses equal, and real training whose float32
losses are mostly exactly 0.0 (a linear classifier on separable data with flipped labels).

A tie with the quantile is not above it, so neither leaves out learned samples: in 0.8.0 the
guard counted a tie as high, and on the classifier below it left out 301 and 381 of 400
samples in its sixth and seventh sifted epochs and trained 99 and 19 against a budget of 200,
without a word. Now at most ``1 - q`` of the scored samples are left out, the budget is
trained, and an epoch that trains far less than its budget is warned about.
"""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld
from tests.neuron_sift.epoch.thread_runs import train


def equal_loss(ids: torch.Tensor, epoch: int) -> torch.Tensor:
    return torch.ones(ids.shape[0])


@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize("world", [1, 2])
def test_equal_losses_leave_nothing_out_and_train_the_budget(monkeypatch, caplog, table, world):
    config = {"score_table": table, "noise_guard_epochs": 1, "kept_share": 0.5, **PRUNE_FROM_THE_START}
    with caplog.at_level(logging.WARNING):
        run = train(monkeypatch, world, config, loss=equal_loss)
    sifted = [h for h in run.history[0] if h["kind"] == "sift"]
    assert len(sifted) >= 2  # the guard's streaks are set after the first sifted epoch: later ones plan with them
    assert all(h["excluded"] == 0 for h in sifted)
    assert all(h["kept"] == sifted[0]["kept"] > 0 for h in sifted)  # the budget, every sifted epoch
    decided = [[(h["kind"], h["kept"], h["excluded"]) for h in r] for r in run.history]
    assert all(d == decided[0] for d in decided)  # every rank decided alike
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_a_guard_that_leaves_some_samples_still_excludes(monkeypatch, table):
    """Distinct losses: the guard leaves out the top ones, at most a fifth (q = 0.8)."""
    config = {"score_table": table, "noise_guard_epochs": 1, "kept_share": 0.5, **PRUNE_FROM_THE_START}
    run = train(monkeypatch, 1, config, loss=lambda ids, epoch: ids.float() + 1.0)
    excluded = [h["excluded"] for h in run.history[0] if h["kind"] == "sift"]
    assert any(excluded) and max(excluded) <= 0.2 * 96


N, EPOCHS, BUDGET = 400, 10, 0.5
GUARD = {"noise_guard_epochs": 3, "noise_guard_quantile": 0.8}


def separable_with_flipped_labels():
    """400 points a line separates, scaled so a linear model's float32 losses reach exactly 0.0;
    5% of the labels flipped."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=g) * 20
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    flipped = torch.randperm(N, generator=g)[: N // 20]
    y[flipped] = 1 - y[flipped]
    return TensorDataset(torch.arange(N), x, y), set(flipped.tolist())


def classifier_run(world: ThreadWorld, table: str):
    """Each rank trains the same linear model by SGD on the epoch loader's batches, gradients
    averaged over the ranks (DDP's all-reduce): the history, and each sifted epoch's excluded
    samples with how many of them are flipped, the share of exact zero losses."""
    data, flipped = separable_with_flipped_labels()
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    config = {"seed": 0, "kept_share": BUDGET, "score_table": table, **GUARD, **PRUNE_FROM_THE_START}
    loader = EpochSiftingDataloader(config, DataLoader(data, batch_size=20, shuffle=True), EPOCHS)
    zeros = []
    for _ in range(EPOCHS):
        for _ids, x, y in loader:
            per_sample = F.cross_entropy(model(x), y, reduction="none")
            zeros.append(float((per_sample == 0.0).float().mean()))
            optimizer.zero_grad()
            loader.weighted_loss(per_sample).backward()
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad /= world.world
            optimizer.step()
    return loader.metrics()["epochs"], flipped, max(zeros)


@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_classifier_with_mostly_zero_losses_trains_its_budget_and_leaves_out_the_flipped(
    monkeypatch, caplog, table, ranks
):
    world = ThreadWorld(ranks)
    world.patch(monkeypatch)
    with caplog.at_level(logging.WARNING):
        runs = world.run([lambda: classifier_run(world, table) for _ in range(ranks)])
    history, flipped, most_zeros = runs[0]
    assert most_zeros > 0.8  # more than 1 - q of the losses tie at 0.0: the case of the issue
    sifted = [h for h in history if h["kind"] == "sift"]
    assert len(sifted) == 8 and all(h["kept"] == BUDGET * N for h in sifted)  # the budget, every epoch
    assert all(h["excluded"] <= 0.2 * N for h in sifted)
    assert max(h["excluded"] for h in sifted) >= len(flipped) // 2  # the guard still does its work
    decided = [[(h["kind"], h["kept"], h["excluded"]) for h in r[0]] for r in runs]
    assert all(d == decided[0] for d in decided)  # every rank decided alike
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_epoch_far_below_its_budget_is_warned_about(caplog):
    """Whatever the cause (here a guard that may leave out nine tenths of the samples, and does):
    a sifted epoch that trains less than four fifths of its budget says so, naming the guard."""
    data, _ = separable_with_flipped_labels()
    config = {
        "seed": 0,
        "kept_share": 0.5,
        "noise_guard_epochs": 1,
        "noise_guard_quantile": 0.1,
        **PRUNE_FROM_THE_START,
    }
    loader = EpochSiftingDataloader(config, DataLoader(data, batch_size=20), 4)
    with caplog.at_level(logging.WARNING):
        for _ in range(4):
            for ids, x, _y in loader:
                loader.weighted_loss(x[:, 0].abs() + ids.float())  # distinct losses: nine tenths above q
    short = [h for h in loader.history if h["kind"] == "sift" and h["kept"] < 0.8 * 0.5 * N]
    assert short
    warned = [r.getMessage() for r in caplog.records if "below its budget" in r.getMessage()]
    assert len(warned) == len(short) and all("the noise guard left out" in m for m in warned)
