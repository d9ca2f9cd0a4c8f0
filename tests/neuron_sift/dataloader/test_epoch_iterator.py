"""The per-epoch iterator's lifetime (``epoch_iterator.SiftingEpoch``) and the loader's pass
position (``parts.PassPosition``)."""

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
