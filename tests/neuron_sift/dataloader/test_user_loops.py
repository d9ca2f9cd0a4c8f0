"""The per-batch loader in the situations a new user's script meets (issue 21's scripts,
where they apply to this loader): a sampler over a subset, a peek, a loop that leaves an
epoch early. Documented in docs/checkpoints.md ("Epoch boundaries, peeks and abandoned
epochs: both loaders")."""

import torch
from torch.utils.data import BatchSampler, DataLoader, SubsetRandomSampler

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.dataloader.fakes import LossTableDataset, OracleLoss, tiny_model

N, B = 100, 8


class ReadLog(LossTableDataset):
    """Logs every index the DataLoader reads."""

    def __init__(self, losses):
        super().__init__(losses)
        self.reads = []

    def __getitem__(self, i):
        self.reads.append(int(i))
        return super().__getitem__(i)


def sifting(source, mode="fixed"):
    return SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=32,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            selection_mode=mode,
            seed=3,
        ),
        orig_dataloader=source,
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )


def test_the_users_sampler_decides_what_is_read_and_sifted():
    """The per-batch loader iterates the user's DataLoader as it is: a train split given by a
    SubsetRandomSampler (or a BatchSampler over one) is all it ever reads, scores and emits."""
    train = list(range(60))
    for kwargs in (
        {"sampler": SubsetRandomSampler(train), "batch_size": B},
        {"batch_sampler": BatchSampler(SubsetRandomSampler(train), B, drop_last=False)},
    ):
        data = ReadLog(torch.rand(N, generator=torch.Generator().manual_seed(1)))
        loader = sifting(DataLoader(data, **kwargs))
        emitted = [i for _ in range(3) for ids, _ in loader for i in ids.tolist()]
        assert set(data.reads) == set(train), kwargs
        assert emitted and set(emitted) <= set(train)
        assert loader.counts.num_orig_samples_seen == 3 * len(train)


def test_a_peek_spends_an_epoch():
    """What docs/checkpoints.md says of a peek: leaving the iteration ends the epoch, so the
    next ``iter()`` runs the next epoch (one more than a run without the peek has started);
    the peeked epoch's unread source batches are never scored."""
    plain = sifting(DataLoader(ReadLog(torch.rand(N, generator=torch.Generator().manual_seed(2))), batch_size=B))
    for _ in plain:
        pass
    data = ReadLog(torch.rand(N, generator=torch.Generator().manual_seed(2)))
    loader = sifting(DataLoader(data, batch_size=B))
    next(iter(loader))
    assert loader.epoch == plain.epoch  # the peek started an epoch, as the whole plain run did
    seen = loader.counts.num_orig_samples_seen
    assert 0 < seen < N  # the peek scored only what it needed for one batch
    for _ in loader:
        pass
    assert loader.epoch == plain.epoch + 1  # the peek spent an epoch
    assert loader.counts.num_orig_samples_seen == seen + N  # the next epoch read the whole source


def test_a_loop_that_breaks_leaves_the_rest_of_its_epoch_unscored():
    data = ReadLog(torch.rand(N, generator=torch.Generator().manual_seed(3)))
    loader = sifting(DataLoader(data, batch_size=B))
    for k, _batch in enumerate(loader):
        if k == 2:
            break
    left = loader.counts.num_orig_samples_seen
    assert left < N
    for _ in loader:
        pass
    assert loader.counts.num_orig_samples_seen == left + N  # the next epoch starts from its first batch
    assert data.reads[left:] == list(range(N))
