"""The batches a ``SiftingDataloader`` will emit, counted ahead (``dataloader/batch_counts.py``):
the expected kept share of every scored sample, the delay passed through, the remainder
carried into the next epoch."""

import pytest
from torch.utils.data import DataLoader

from neuron_sift.dataloader.batch_counts import check_yields_a_batch, plan_epochs, source_batch_sizes
from tests.neuron_sift.dataloader.fakes import make_config

TEN_BATCHES = [8] * 10


def test_probabilistic_counts_the_expected_share_and_carries_the_remainder():
    config = make_config(beta=3.0)  # keeps a quarter: 2 of every 8 samples, in expectation
    assert config.expected_kept_share() == 0.25
    # 20 kept per epoch: 2 batches and 4 samples carried, then 24 kept -> 3 batches.
    assert plan_epochs(config, TEN_BATCHES, 8, 0, 0, 2) == ([2, 3], 160)
    assert plan_epochs(config, TEN_BATCHES, 8, 0, 6, 1) == ([3], 80)  # 6 pending now: 26 -> 3


def test_fixed_mode_counts_the_keep_count_of_every_batch():
    config = make_config(beta=1.0, mode="fixed")
    assert plan_epochs(config, TEN_BATCHES, 8, 0, 0, 2) == ([5, 5], 160)
    assert plan_epochs(config, [8, 8, 3], 8, 0, 0, 1) == ([1], 19)  # 4 + 4 + round(1.5) = 10 kept


def test_delayed_batches_pass_through_once_or_every_epoch():
    once = make_config(beta=3.0, delay=3)
    # Epoch 0: 3 passed through, 7 scored keep 14 -> 1 batch, 6 carried; epoch 1: 26 -> 3.
    assert plan_epochs(once, TEN_BATCHES, 8, 0, 0, 2) == ([4, 3], 136)
    assert plan_epochs(once, TEN_BATCHES, 8, 3, 0, 1) == ([2], 80)  # the delay already passed
    every = make_config(beta=3.0, delay=3, repeat=True)
    assert plan_epochs(every, TEN_BATCHES, 8, 3, 0, 2) == ([4, 5], 112)


def test_a_resumed_epoch_counts_what_is_left_of_it_ready_batches_first():
    config = make_config(beta=3.0)
    # 8 source batches consumed, 10 samples pending: the ready batch first, then the 2 batches
    # left keep 4 more: 2 + 4 = 6, no further batch. Only the 2 batches left are scored.
    assert plan_epochs(config, TEN_BATCHES, 8, 0, 10, 1, resume_at=8) == ([1], 16)
    assert plan_epochs(config, TEN_BATCHES, 8, 0, 12, 1, resume_at=8) == ([2], 16)  # 4 + 4 = 8


@pytest.mark.parametrize("epochs", [0, -1, True, 1.0, None])
def test_a_number_of_epochs_that_is_no_count_is_refused(epochs):
    with pytest.raises(ValueError, match=rf"^epochs must be an int >= 1, got {epochs!r}$"):
        plan_epochs(make_config(), TEN_BATCHES, 8, 0, 0, epochs)


def test_source_batch_sizes_follow_the_samplers_length_and_drop_last():
    assert source_batch_sizes(DataLoader(range(20), batch_size=8), 8) == [8, 8, 4]
    assert source_batch_sizes(DataLoader(range(20), batch_size=8, drop_last=True), 8) == [8, 8]
    with pytest.raises(TypeError, match="planned only for a torch DataLoader with a batch size"):
        source_batch_sizes(DataLoader(range(20), batch_size=8), None)
    with pytest.raises(TypeError, match="the source loader has no length"):
        source_batch_sizes(iter(range(20)), 8)


def test_a_source_that_yields_no_batch_is_refused():
    check_yields_a_batch(DataLoader(range(5), batch_size=8))  # one short batch: trains
    with pytest.raises(ValueError, match="yields 5 samples per epoch on this rank, fewer than one batch of 8"):
        check_yields_a_batch(DataLoader(range(5), batch_size=8, drop_last=True))
