"""A pass's lifetime (``sifting_pass.SiftingPass``: one epoch over the source) and the
loader's pass position (``parts.PassPosition``), whose epochs the notes number from 0."""

import gc
import weakref

import pytest
import torch

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.dataloader.parts import PassPosition
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader, tiny_model


def make_loader(n=64, batch_size=8):
    config = RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=32,
        loss_based_sift_config={"sift_config": {"sift_delay": 0}},
        selection_mode="fixed",
    )
    losses = torch.rand(n, generator=torch.Generator().manual_seed(0))
    return SiftingDataloader(
        sift_config=config,
        orig_dataloader=loss_table_loader(losses, batch_size),
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )


def test_a_newer_iteration_voids_the_older_one():
    loader = make_loader()
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="SiftingDataloader: a new iteration was started"):
        next(first)
    assert len(list(second)) == 4  # the newer one runs a whole epoch


def test_loading_a_state_voids_the_iterators_started_before():
    loader = make_loader()
    state = loader.state_dict()
    first = iter(loader)
    next(first)
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match="no longer valid"):
        next(first)
    assert len(list(loader)) == 4


def test_the_loader_does_not_keep_an_abandoned_epoch_alive():
    """The loader keeps only the iteration's number: a dropped iterator is freed, and the
    DataLoader iterator it holds (with any workers) with it."""
    loader = make_loader()
    epoch = iter(loader)
    next(epoch)
    ref = weakref.ref(epoch)
    source = weakref.ref(epoch._sources._it)
    del epoch
    gc.collect()
    assert ref() is None and source() is None
    assert len(list(loader)) == 4  # the next iteration starts the next epoch


def test_pass_position_round_trips_through_its_state():
    position = PassPosition(3, True, 5)
    assert PassPosition.from_state(position.state_dict()) == position
    assert position.state_dict() == {"epoch": 3, "in_progress": True, "consumed": 5}


def test_pass_position_counts_epochs_started_and_indexes_them_from_0():
    assert PassPosition().index == -1  # before the first epoch
    assert PassPosition(1, True, 0).index == 0
    loader = make_loader()
    list(loader)
    assert loader.epoch == 1 and loader.position.index == 0  # as the epoch loader's epoch and its logs


class FailsInSecondEpoch(torch.utils.data.Dataset):
    """Raises at one sample of the second pass over it."""

    def __init__(self, n, bad):
        self.n, self.bad, self.reads = n, bad, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        if self.reads > self.n and i == self.bad:
            raise KeyError(f"sample {i}")
        return torch.tensor(i), torch.tensor(i / self.n)


def test_notes_number_epochs_from_0_as_the_epoch_mode_and_set_epoch_do():
    config = RelativeProbabilisticSiftConfig(
        beta_value=1.0, loss_history_length=32, loss_based_sift_config={"sift_config": {"sift_delay": 0}}
    )
    loader = SiftingDataloader(
        sift_config=config,
        orig_dataloader=torch.utils.data.DataLoader(FailsInSecondEpoch(32, bad=9), batch_size=8),
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )
    list(loader)  # epoch 0
    with pytest.raises(KeyError) as info:
        list(loader)
    assert "neuron_sift: while loading source batch 1 of epoch 1 from orig_dataloader" in info.value.__notes__
