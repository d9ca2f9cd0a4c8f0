"""A loader's state loaded into a loader of another kind is refused with a message naming
both kinds (the epoch loader's state and the per-batch loader's both say version 2)."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader, Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations.schedules import ExactLengthLoader
from neuron_sift.shared.checkpoints import state_kind


class Score(Loss):
    def loss(self, model, transformed_batch, original_batch=None):
        return transformed_batch[0].float()


def source():
    return DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4)


def per_batch():
    cfg = RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=8, selection_mode="fixed", seed=0)
    return SiftingDataloader(sift_config=cfg, orig_dataloader=source(), loss_impl=Score(), model=torch.nn.Identity())


def epoch_level():
    return EpochSiftingDataloader({"seed": 0, "kept_share": 0.5}, source(), num_epochs=2)


def test_each_state_names_its_kind():
    assert state_kind(per_batch().state_dict()) == "SiftingDataloader"
    assert state_kind(epoch_level().state_dict()) == "EpochSiftingDataloader"
    assert state_kind(ExactLengthLoader(per_batch()).state_dict()) == "ExactLengthLoader"
    assert state_kind({"version": 2}) is None and state_kind([1]) is None


def test_an_epoch_state_into_the_per_batch_loader():
    state = epoch_level().state_dict()
    assert state["version"] == per_batch().state_dict()["version"]  # the version alone cannot tell them apart
    with pytest.raises(
        ValueError,
        match=r"not a SiftingDataloader state: it comes from EpochSiftingDataloader\.state_dict\(\); "
        r"load it with EpochSiftingDataloader\.load_state_dict\(\)",
    ):
        per_batch().load_state_dict(state)


def test_an_exact_length_state_into_the_per_batch_loader():
    with pytest.raises(ValueError, match=r"not a SiftingDataloader state: it comes from ExactLengthLoader"):
        per_batch().load_state_dict(ExactLengthLoader(per_batch()).state_dict())


def test_a_per_batch_state_into_the_epoch_loader():
    with pytest.raises(
        ValueError,
        match=r"not an EpochSiftingDataloader state: it comes from SiftingDataloader\.state_dict\(\); "
        r"load it with SiftingDataloader\.load_state_dict\(\)",
    ):
        epoch_level().load_state_dict(per_batch().state_dict())
    with pytest.raises(ValueError, match=r"not an EpochSiftingDataloader state: got a list that is no loader's state"):
        epoch_level().load_state_dict([1, 2])


def test_each_kind_still_loads_its_own_state():
    a, b = per_batch(), per_batch()
    b.load_state_dict(a.state_dict())
    c, d = epoch_level(), epoch_level()
    d.load_state_dict(c.state_dict())
