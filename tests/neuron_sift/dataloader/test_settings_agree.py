"""Ranks whose per-batch loaders were built with settings that move their meeting points or
emitted counts (``neuron_sift/dataloader/rank_settings.py``) are refused at construction, on
every rank, naming each setting and its value on each rank: otherwise one rank waits in a
collective its peer never calls (a process group's timeout), or the ranks emit different
numbers of batches. Two ranks as threads, with the loader's own ``RankGroup`` over a patched
``torch.distributed`` (``tests/neuron_sift/shared/thread_dist.py``)."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.dataloader.fakes import OracleLoss, tiny_model
from tests.neuron_sift.shared.thread_dist import build_on_ranks


class Samples(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i), torch.tensor(float(i % 7) + 0.5)


def build(
    n=400,
    batch_size=16,
    drop_last=False,
    max_pending=None,
    seed=0,
    beta=1.0,
    history=64,
    delay=0,
    repeat=False,
    mode="probabilistic",
    global_history=False,
):
    config = RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=history,
        loss_based_sift_config={"sift_config": {"sift_delay": delay, "repeat_delay_per_epoch": repeat}},
        selection_mode=mode,
        seed=seed,
        global_loss_history=global_history,
    )
    source = DataLoader(Samples(n), batch_size=batch_size, drop_last=drop_last)
    return SiftingDataloader(config, source, loss_impl=OracleLoss(), model=tiny_model(), max_pending=max_pending)


# (the setting's name in the message, rank 0's arguments, rank 1's, the values shown)
DIFFERENCES = [
    ("selection_mode", {"mode": "probabilistic"}, {"mode": "fixed"}, "'probabilistic'", "'fixed'"),
    ("beta_value", {"beta": 1.0}, {"beta": 2.0}, "1.0", "2.0"),
    ("loss_history_length", {"history": 64}, {"history": 128}, "64", "128"),
    ("global_loss_history", {"global_history": False}, {"global_history": True}, "False", "True"),
    ("sift_delay", {"delay": 0}, {"delay": 10}, "0", "10"),
    ("repeat_delay_per_epoch", {"repeat": False}, {"repeat": True}, "False", "True"),
    ("batch_size", {"batch_size": 16}, {"batch_size": 20}, "16", "20"),
    ("drop_last", {"drop_last": False}, {"drop_last": True}, "False", "True"),
    ("samples per epoch (the source loader's sampler length)", {"n": 400}, {"n": 420}, "400", "420"),
    ("max_pending", {"max_pending": None}, {"max_pending": 64}, "None", "64"),
]


@pytest.mark.parametrize(("setting", "first", "second", "shown0", "shown1"), DIFFERENCES, ids=lambda v: str(v)[:24])
def test_ranks_with_a_different_setting_are_refused_on_every_rank(monkeypatch, setting, first, second, shown0, shown1):
    args = [first, second]
    out = build_on_ranks(monkeypatch, 2, lambda rank: build(**args[rank]))
    assert all(isinstance(o, ValueError) for o in out), out  # every rank refuses: none waits in a collective
    message = str(out[0])
    assert str(out[1]) == message
    assert message.startswith("SiftingDataloader was built with different settings on different ranks")
    assert message.count("differs between ranks") == 1, message  # only the setting that differs
    assert f"{setting} differs between ranks: rank 0: {shown0}; rank 1: {shown1}" in message


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_ranks_with_the_same_settings_and_their_own_seeds_are_built(monkeypatch, mode):
    """The seed may differ: each rank mixes it with its rank, so ranks draw independently anyway."""
    out = build_on_ranks(monkeypatch, 2, lambda rank: build(mode=mode, seed=rank))
    assert all(isinstance(o, SiftingDataloader) for o in out), out
    assert [o.ranks.rank for o in out] == [0, 1]
    assert out[0].agreement.coordinated == out[1].agreement.coordinated == (mode == "probabilistic")


def test_a_source_that_yields_no_batch_per_epoch_is_refused():
    """5 samples in batches of 8 with drop_last: every epoch would yield nothing, and the loop
    would run zero steps without a word."""
    with pytest.raises(ValueError, match=r"yields 5 samples per epoch on this rank, fewer than one batch of 8") as e:
        build(n=5, batch_size=8, drop_last=True)
    assert "train nothing" in str(e.value) and "drop_last=False" in str(e.value)
    build(n=5, batch_size=8, drop_last=False)  # one short batch: trained
