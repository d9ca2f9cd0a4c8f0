"""Sources and budgets that would train nothing are refused, and how a budget becomes a
whole count of samples (``neuron_sift.epoch.planning.planned_counts``: ``check_planned_counts``, and
``inspect_source``; the rounding is ``EpochPlanner.budget_count``, documented in
``EpochSiftConfig`` and docs/configuration.md)."""

import logging

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SubsetRandomSampler

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.planning.planned_counts import check_planned_counts
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.sift_config.epoch_config import EpochSiftConfig
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle_loss


def planner(n, batch, drop_last, kept_share=None, world=1, support=None, epochs=4):
    config = EpochSiftConfig(kept_share=kept_share, seed=0, **PRUNE_FROM_THE_START)
    return EpochPlanner(PlanSettings(config, n, batch, drop_last, 0, epochs, world, 0, support))


def trained_per_epoch(loader, epochs):
    out = []
    for _ in range(epochs):
        ids = []
        for x, _y in loader:
            ids += ids_of(x)
            loader.weighted_loss(oracle_loss(x))
        out.append(ids)
    return out


# -- a source that yields no batch ---------------------------------------------------------


@pytest.mark.parametrize("batching", ["batch_size", "batch_sampler"])
def test_a_dataset_shorter_than_one_batch_with_drop_last_is_refused(batching):
    ds = IdDataset(5)
    if batching == "batch_size":
        dl = DataLoader(ds, batch_size=8, shuffle=True, drop_last=True)
    else:
        dl = DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), 8, drop_last=True))
    with pytest.raises(ValueError, match=r"the dataset has 5 samples, fewer than one batch of 8") as raised:
        EpochSiftingDataloader({"kept_share": 0.5}, dl, num_epochs=3)
    assert "drop_last=False" in str(raised.value) and "batch size of at most 5" in str(raised.value)


def test_without_drop_last_a_dataset_shorter_than_one_batch_trains_it_as_one_short_batch():
    loader = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 0}, DataLoader(IdDataset(5), batch_size=8, shuffle=True), num_epochs=2
    )
    assert len(loader) == 1
    assert [sorted(ids) for ids in trained_per_epoch(loader, 1)] == [[0, 1, 2, 3, 4]]


def test_a_ranks_share_shorter_than_one_batch_with_drop_last_is_refused():
    """12 samples over 2 ranks are 6 each: batches of 8 with drop_last give no rank a batch,
    though the dataset alone holds one."""
    with pytest.raises(
        ValueError, match=r"the dataset has 12 samples, 6 for each of the 2 ranks, fewer than one batch"
    ):
        check_planned_counts(planner(12, 8, True, world=2))
    check_planned_counts(planner(16, 8, True, world=2))  # one batch each
    check_planned_counts(planner(12, 8, False, world=2))  # one short batch each


def test_a_sampler_yielding_fewer_samples_than_one_batch_with_drop_last_is_refused():
    with pytest.raises(ValueError, match=r"the sampler yields 3 samples, fewer than one batch of 4"):
        check_planned_counts(planner(40, 4, True, support=np.array([1, 5, 9])))


def test_the_loader_refuses_a_budget_that_trains_no_batch_with_drop_last():
    dl = DataLoader(IdDataset(50), batch_size=8, shuffle=True, drop_last=True)
    with pytest.raises(ValueError, match="kept_share=0.01 keeps 1 of the 50 samples per sifted epoch"):
        EpochSiftingDataloader({"kept_share": 0.01}, dl, num_epochs=3)


def test_the_loader_refuses_a_sampler_shorter_than_one_batch_with_drop_last():
    dl = DataLoader(IdDataset(40), batch_size=4, sampler=SubsetRandomSampler([1, 5, 9]), drop_last=True)
    with pytest.raises(ValueError, match="the sampler yields 3 samples, fewer than one batch of 4"):
        EpochSiftingDataloader({}, dl, num_epochs=3)


def test_the_loader_logs_a_budget_far_from_its_share(caplog):
    with caplog.at_level(logging.WARNING, logger=EPOCH_LOGGER):
        EpochSiftingDataloader({"kept_share": 0.01}, DataLoader(IdDataset(50), batch_size=8), num_epochs=3)
    assert "kept_share=0.01 of 50 samples trains 1 per sifted epoch" in caplog.text


def test_a_budget_shorter_than_one_batch_per_rank_with_drop_last_is_refused():
    with pytest.raises(ValueError, match=r"kept_share=0.01 keeps 1 of the 50 samples per sifted epoch") as raised:
        check_planned_counts(planner(50, 8, True, kept_share=0.01))
    assert "every sifted epoch would train nothing" in str(raised.value)
    assert "kept_share >= 0.16" in str(raised.value)  # one whole batch of 8 of 50
    with pytest.raises(ValueError, match=r"keeps 10 of the 100 samples per sifted epoch, 5 for each of the 2 ranks"):
        check_planned_counts(planner(100, 8, True, kept_share=0.1, world=2))
    check_planned_counts(planner(50, 8, True, kept_share=0.16))  # 8 kept: one batch
    check_planned_counts(planner(50, 8, True, kept_share=0.01, epochs=1))  # no sifted epoch in the run


# -- how a budget rounds -------------------------------------------------------------------


@pytest.mark.parametrize(
    "share, m, world, count",
    [
        (0.01, 50, 1, 1),  # 0.5 rounds half up: 1, not 0 (nor Python's round(0.5) == 0)
        (0.05, 50, 1, 3),  # 2.5 -> 3 (Python's round(2.5) == 2)
        (0.3, 45, 1, 14),  # 13.5 -> 14
        (0.29, 45, 1, 13),  # 13.05 -> 13
        (0.5, 45, 4, 20),  # 22.5 -> 23, then down to a multiple of 4 ranks
        (0.01, 50, 2, 2),  # 1, raised to one per rank
        (0.001, 50, 3, 3),  # 0.05 -> 0, raised to one per rank
    ],
)
def test_a_budget_keeps_kept_share_times_m_rounded_half_up_then_to_whole_ranks(share, m, world, count):
    """The documented rule: ``floor(kept_share * M + 0.5)``, then down to a multiple of the
    world size ``W``, at least ``W``."""
    assert planner(m, 4, False, kept_share=share, world=world).budget_count() == count


def test_a_budget_of_0_01_on_50_samples_trains_1_sample_per_sifted_epoch():
    loader = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 2, "kept_share": 0.01},
        DataLoader(IdDataset(50), batch_size=8, shuffle=True),
        num_epochs=3,
    )
    trained = trained_per_epoch(loader, 3)
    assert [len(ids) for ids in trained] == [50, 1, 1]
    assert [h["kept"] for h in loader.history] == [50, 1, 1]
    assert loader.history[1]["observed_kept_share"] == pytest.approx(0.02)


def test_a_budget_whose_count_trains_a_share_far_from_kept_share_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger=EPOCH_LOGGER):
        check_planned_counts(planner(50, 8, False, kept_share=0.01))
    (line,) = [r.getMessage() for r in caplog.records]
    assert "kept_share=0.01 of 50 samples trains 1 per sifted epoch, a share of 0.02" in line
    assert "rounded half up" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=EPOCH_LOGGER):
        check_planned_counts(planner(45, 8, True, kept_share=0.5))  # 23 kept, 16 in whole batches
    (line,) = [r.getMessage() for r in caplog.records]
    assert "trains 16 per sifted epoch" in line and "the budget keeps 23" in line
    assert "drop_last=True trains only each rank's whole batches of 8: 16" in line


@pytest.mark.parametrize(
    "n, batch, drop_last, share, world",
    [
        (100, 16, True, 0.5, 1),  # 48 of the 50 kept in 3 whole batches: 0.48 (the docs' example)
        (45, 8, False, 0.5, 1),  # 23 of 45: 0.511
        (1000, 32, False, 0.3, 8),  # 300 -> 296 for 8 ranks
    ],
)
def test_a_budget_close_to_kept_share_is_not_logged(caplog, n, batch, drop_last, share, world):
    with caplog.at_level(logging.WARNING, logger=EPOCH_LOGGER):
        check_planned_counts(planner(n, batch, drop_last, kept_share=share, world=world))
    assert caplog.records == []


def test_the_checks_read_the_counts_the_loader_trains():
    """``check_planned_counts`` reads the planner's counts: 45 samples, batches of 8 with
    drop_last and a budget of 0.5 train 16 per sifted epoch, as it says."""
    loader = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 1, "kept_share": 0.5},
        DataLoader(IdDataset(45), batch_size=8, shuffle=True, drop_last=True),
        num_epochs=3,
    )
    check_planned_counts(loader.planner)
    assert [len(ids) for ids in trained_per_epoch(loader, 3)] == [40, 16, 16]
    assert torch.is_tensor(loader.plan.order) and len(loader.plan.order) == 23


@pytest.mark.parametrize(
    "budget", [{"kept_share": 0.5, "warmup_epochs": 2}, {"max_pruned_share": 0.5, "warmup_epochs": 3}]
)
def test_a_budget_without_num_epochs_after_a_long_warm_up_is_counted(budget):
    """Without ``num_epochs`` the first sifted epoch comes after every warm-up epoch: the
    check reads it there (it once looked only at epochs 0 and 1 and found none)."""
    data = torch.utils.data.TensorDataset(torch.arange(64))
    loader = EpochSiftingDataloader({"seed": 0, **budget}, DataLoader(data, batch_size=8))
    first = budget["warmup_epochs"]
    assert loader.planner.kind(first) == "sift" and loader.planner.epoch_batches(first) < 8
