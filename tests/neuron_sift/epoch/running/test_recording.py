"""What a step records: smoothed scores (``score_smoothing``, a moving average of each sample's
losses) and losses with no per-sample value (``weighted_batch_loss``: every sample of a batch
scored by the moving average of the batch losses it appeared in, the batch's loss weighted by
its samples' mean weight), under both score tables; the device path on torch-xla:
``tests/neuron_sift/epoch/test_epoch_xla.py``."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from neuron_sift.exceptions import LossOutputException
from neuron_sift.kernels.scores import smoothed
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld

NAN = float("nan")


def test_the_moving_average_starts_at_the_first_loss_and_weighs_each_new_one():
    previous = torch.tensor([NAN, 2.0, 4.0])
    assert smoothed(previous, torch.tensor([1.0, 1.0, 1.0]), 0.25).tolist() == [1.0, 1.75, 3.25]


def epoch_loss(ids, epoch):
    return oracle(ids) * (epoch + 1)


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_smoothed_scores_are_each_samples_moving_average_of_its_losses(table):
    dl = DataLoader(IdDataset(40), batch_size=8, shuffle=True)
    cfg = {"seed": 1, "warmup_epochs": 3, "score_smoothing": 0.25, "score_table": table}
    loader = EpochSiftingDataloader(cfg, dl, num_epochs=3)
    for epoch in range(3):
        for x, _y in loader:
            loader.weighted_loss(epoch_loss(torch.tensor(ids_of(x)), epoch))
    ids = torch.arange(40)
    expected = epoch_loss(ids, 0)
    for epoch in (1, 2):
        expected = 0.25 * epoch_loss(ids, epoch) + 0.75 * expected
    torch.testing.assert_close(loader.tables.snapshot()[loader.planner.slots(ids.numpy())], expected)


def test_a_batch_loss_scores_every_sample_of_its_batch_and_is_weighted_by_their_mean_weight():
    dl = DataLoader(IdDataset(16), batch_size=4, shuffle=True)
    loader = EpochSiftingDataloader({"seed": 1, "kept_share": 0.5, **PRUNE_FROM_THE_START}, dl, num_epochs=3)
    means = {}
    for x, _y in loader:  # the warm-up: unit weights, every sample's score its batch's loss
        ids = torch.tensor(ids_of(x))
        loss = ids.float().mean().requires_grad_()
        assert loader.weighted_batch_loss(loss).item() == pytest.approx(loss.item())
        means.update({int(i): loss.item() for i in ids})
    scores = loader.tables.snapshot()
    assert {i: scores[i].item() for i in means} == pytest.approx(means)
    batches = {}
    for x, _y in loader:  # a sifted epoch: weights 1 / keep probability
        ids = torch.tensor(ids_of(x))
        loss = torch.tensor(3.0, requires_grad=True)
        out = loader.weighted_batch_loss(loss)
        weights = loader.tables.weights[ids]
        assert out.item() == pytest.approx(3.0 * weights.mean().item())
        out.backward()
        assert loss.grad.item() == pytest.approx(weights.mean().item())
        batches.update({int(i): float(scores[i]) for i in ids})
    after = loader.tables.snapshot()
    for i, before in batches.items():  # the batch's 3.0 averaged in with weight 0.5 (no score_smoothing)
        assert after[i].item() == pytest.approx(0.5 * 3.0 + 0.5 * before)
    with pytest.raises(LossOutputException, match="needs the batch's loss as one floating value"):
        loader.weighted_batch_loss(torch.ones(4))
    with pytest.raises(LossOutputException, match="no yielded batch is waiting"):
        loader.weighted_batch_loss(torch.tensor(1.0))


def paired_views(n=256, dim=8):
    """Pairs of noisy views of the same point: what a contrastive loss learns to match."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(n, dim, generator=g)
    return TensorDataset(
        torch.arange(n), base + 0.1 * torch.randn(n, dim, generator=g), base + 0.1 * torch.randn(n, dim, generator=g)
    )


def info_nce(a, b, temperature=0.2):
    """InfoNCE over the batch: each view must pick its own pair among the batch's others."""
    logits = F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / temperature
    return F.cross_entropy(logits, torch.arange(a.shape[0]))


def contrastive_run(table, world):
    torch.manual_seed(0)
    encoder = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.5)
    cfg = {"seed": 2, "kept_share": 0.5, "score_table": table, **PRUNE_FROM_THE_START}
    loader = EpochSiftingDataloader(cfg, DataLoader(paired_views(), batch_size=32, shuffle=True), num_epochs=5)
    losses = []
    for _ in range(5):
        for _ids, a, b in loader:
            raw = info_nce(encoder(a), encoder(b))
            loss = loader.weighted_batch_loss(raw)
            optimizer.zero_grad()
            loss.backward()
            for p in encoder.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad /= world.world
            optimizer.step()
            losses.append(raw.item())
    return [h["kind"] for h in loader.history], [h["kept"] for h in loader.history], loader.metrics(), losses


@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_an_info_nce_loss_trains_and_prunes_under_both_tables(monkeypatch, table, ranks):
    """A contrastive loss on paired views, its batch loss passed to ``weighted_batch_loss``:
    every sample is scored, sifted epochs prune to the budget (the same on every rank), and
    the contrastive loss falls."""
    world = ThreadWorld(ranks)
    world.patch(monkeypatch)
    runs = world.run([lambda: contrastive_run(table, world) for _ in range(ranks)])
    kinds, kept, metrics, losses = runs[0]
    assert kinds == ["warmup", "sift", "sift", "sift", "sift"] and kept == [256, 128, 128, 128, 128]
    assert all(r[0] == kinds and r[1] == kept for r in runs)
    assert sum(r[2]["scores_recorded"] for r in runs) == (256 if table == "sharded" else 256 * ranks)
    assert sum(losses[-4:]) < sum(losses[:4])  # it learns
