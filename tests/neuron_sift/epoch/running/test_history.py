"""The record of epochs (``neuron_sift.epoch.running.history.EpochHistory``). What users rely
on: each entry names the share the epoch trained ``observed_kept_share`` (the setting
``kept_share`` is a budget: the measured share is not stored under its name); a checkpoint
of a version whose entries named it ``kept_share`` loads into ``observed_kept_share``;
``metrics()["epochs"]`` reports it under that one name too (0.5.0's alias ``kept_share``
is gone)."""

import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.planning.plan import EpochPlan, TrainedCounts
from neuron_sift.epoch.running.history import EpochHistory
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, oracle_loss


def sifted(epoch=1):
    return EpochPlan(epoch, "sift", torch.arange(5), torch.full((20,), 2.0), torch.full((20,), 0.5))


def test_an_entry_carries_the_observed_share_of_the_trained_samples_and_not_kept_share():
    history = EpochHistory(20)
    history.planned(sifted(), 2, 0.01, TrainedCounts(kept=4, planned=5, mean_weight=2.0, max_weight=2.0))
    (entry,) = history
    assert entry["observed_kept_share"] == 0.2  # 4 trained of 20, not the 5 drawn
    assert (entry["kept"], entry["planned"], entry["batches"], entry["kind"]) == (4, 5, 2, "sift")
    assert "kept_share" not in entry
    assert "kept_share" not in roundtrip(history.state_dict())["epochs"][0]


OLD = {"epoch": 0, "kind": "warmup", "kept": 20, "planned": 20, "mean_weight": 1.0, "max_weight": 1.0, "batches": 5}


@pytest.mark.parametrize(
    "shares",
    [{"kept_share": 0.75}, {"kept_share": 0.75, "observed_kept_share": 0.75}],
    ids=["before-0.5.0", "0.5.0-to-0.7.0"],
)
def test_an_old_entry_loads_its_share_into_observed_kept_share(shares):
    history = EpochHistory(20)
    history.load_state_dict(roundtrip({"epochs": [{**OLD, **shares}]}))
    (entry,) = history
    assert entry["observed_kept_share"] == 0.75 and "kept_share" not in entry
    assert {k: v for k, v in entry.items() if k != "observed_kept_share"} == OLD


def test_an_entry_with_neither_share_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"history\.epochs\[0\] has neither observed_kept_share nor kept_share"):
        EpochHistory(20).load_state_dict({"epochs": [OLD]})


def test_metrics_report_each_epochs_observed_share_under_one_name():
    loader = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 2, "kept_share": 0.5},
        DataLoader(IdDataset(20), batch_size=5, shuffle=True),
        num_epochs=3,
    )
    for _ in range(2):
        for x, _y in loader:
            loader.weighted_loss(oracle_loss(x))
    epochs = loader.metrics()["epochs"]
    assert [e["observed_kept_share"] for e in epochs] == [1.0, 0.5]
    assert all("kept_share" not in e for e in epochs) and "kept_share" not in loader.metrics()
    assert all("kept_share" not in h for h in loader.history)  # the record itself keeps one name
    assert all("kept_share" not in h for h in loader.state_dict()["history"]["epochs"])
