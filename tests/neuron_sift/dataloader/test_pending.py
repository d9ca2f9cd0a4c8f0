"""Data-parallel agreement that keeps batches pending: bounded pending samples, nothing
overwritten or repeated, every kept sample accounted for, on both backends.

A peer one batch behind at half of the agreement points is simulated in one process (the
agreement is the minimum over ranks of their ready batches); the real multi-process runs
are in tests/neuron_sift/test_distributed.py.
"""

import logging

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.dataloader.fakes import tiny_model

B = 16


class LaggingPeer:
    """Stands in for the RankGroup. ``rate`` None: a peer one ready batch behind at every
    other agreement point. ``rate`` r: a peer that keeps r samples per agreement point
    (fewer than this rank), so the agreed minimum is its ready count and this rank's
    pending samples grow until ``max_pending`` drops some."""

    active, rank, world_size = True, 0, 2

    def __init__(self, rate=None):
        self.rate = rate
        self.calls = 0
        self.unagreed = 0
        self._peer = 0.0

    def min_int(self, value):
        self.calls += 1
        if self.rate is None:
            agreed = max(0, value - 1) if self.calls % 2 else value
        else:
            self._peer += self.rate
            agreed = min(value, int(self._peer // B))
            self._peer -= agreed * B
        self.unagreed += value - agreed
        return agreed


class EpochIds(Dataset):
    """Sample i of pass e has the id e * n + i: every scored instance is unique across epochs,
    and its features repeat its id, so an overwritten row shows as a mismatch."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        uid = self.epoch * self.n + i
        return torch.tensor(uid), torch.full((3,), float(uid)), torch.tensor(((i * 7919) % 101) / 101.0 + 0.01)


class HighLoss:
    def loss(self, model, transformed_batch, original_batch=None):
        return original_batch[2].to(next(model.parameters()).device).float()


def lagging_loader(device, n=16 * 20 + 5, max_pending=None, beta=0.25, rate=0.6 * B):
    data = EpochIds(n)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=beta, loss_history_length=64, loss_based_sift_config={"sift_config": {"sift_delay": 0}}, seed=3
        ),
        orig_dataloader=DataLoader(data, batch_size=B),
        loss_impl=HighLoss(),
        model=tiny_model().to(device),
        max_pending=max_pending,
    )
    loader.ranks = loader.agreement.ranks = LaggingPeer(rate)
    loader.agreement.coordinated = True  # as under torch.distributed in probabilistic mode
    return loader, data


def check_lagging_peer(device, epochs=4, max_pending=None, rate=0.6 * B):
    loader, data = lagging_loader(device, max_pending=max_pending, rate=rate)
    emitted, most_pending = [], 0
    for epoch in range(epochs):
        data.epoch = epoch
        for ids, x, _ in loader:
            ids, x = ids.cpu(), x.cpu()
            assert ids.shape == (B,)
            assert torch.equal(x[:, 0], ids.float()), "a row was overwritten by another sample"
            emitted += ids.tolist()
            most_pending = max(most_pending, loader.num_pending)
    c = loader.counts
    assert loader.ranks.unagreed > 0
    assert len(emitted) == len(set(emitted)) == c.num_samples_emitted, "a sample was emitted twice"
    assert c.num_orig_samples_seen == epochs * len(data)
    assert c.num_orig_samples_kept == c.num_samples_emitted + c.num_samples_pending + c.num_samples_dropped
    assert c.num_samples_pending == loader.num_pending
    pending = loader.pending_batch()
    pending_ids = _ids(pending)
    assert len(set(pending_ids)) == len(pending_ids) == loader.num_pending
    assert not set(pending_ids) & set(emitted)
    bound = loader.max_pending
    assert most_pending <= bound and loader.num_pending <= bound
    return loader


def _ids(pending):
    if pending is None:
        return []
    user = pending.to_user()
    return user[0].cpu().tolist()


def test_lagging_peer_bounds_pending_and_drops_with_accounting(caplog):
    with caplog.at_level(logging.WARNING, logger="neuron_sift.dataloader.sift_dataloader"):
        loader = check_lagging_peer("cpu", epochs=6)
    assert loader.max_pending == 4 * B
    assert loader.counts.num_samples_dropped > 0
    drops = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert drops and len(drops) <= 1 + 6 + loader.counts.num_source_batches // 100  # first, then summaries
    logged = sum(int(r.getMessage().split()[0]) for r in drops)
    assert logged == loader.counts.num_samples_dropped


def test_one_batch_behind_at_half_the_agreements_drops_nothing():
    loader = check_lagging_peer("cpu", rate=None)
    assert loader.counts.num_samples_dropped == 0


def test_max_pending_is_validated():
    with pytest.raises(TypeError, match="max_pending"):
        lagging_loader("cpu", max_pending=2.5)
    loader, _ = lagging_loader("cpu", max_pending=B - 1)
    with pytest.raises(ValueError, match="below the batch size"):
        next(iter(loader))


def test_a_larger_bound_drops_less():
    small = check_lagging_peer("cpu", max_pending=B)
    large = check_lagging_peer("cpu", max_pending=8 * B)
    assert small.counts.num_samples_dropped > large.counts.num_samples_dropped


@pytest.mark.xla
def test_lagging_peer_on_xla_neither_overwrites_nor_repeats():
    torch_xla = pytest.importorskip("torch_xla")
    for rate in (None, 0.6 * B):
        loader = check_lagging_peer(torch_xla.device(), epochs=3, rate=rate)
        assert (loader.counts.num_samples_dropped > 0) == (rate is not None)


@pytest.mark.xla
def test_lagging_peer_xla_matches_eager():
    """The device pending store and the host one drop the same samples (the newest kept)."""
    torch_xla = pytest.importorskip("torch_xla")
    runs = []
    for device in ("cpu", torch_xla.device()):
        loader, data = lagging_loader(device)
        out = []
        for epoch in range(3):
            data.epoch = epoch
            out += [ids.cpu().tolist() for ids, _, _ in loader]
        runs.append((out, loader.counts.as_dict()))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1]["num_samples_dropped"] == runs[1][1]["num_samples_dropped"]
