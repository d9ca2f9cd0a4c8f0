"""What users of the epoch loader see, beyond which ids come out: the order of a sifted
epoch, the user's DataLoader settings in the workers, the noise guard's streaks over
several epochs, the budget's rounding and small budgets, ``drop_last``'s counts, the
weights ``metrics()`` reports, and the merge of scores over data-parallel ranks."""

import functools
import multiprocessing
from collections import deque

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle, oracle_loss
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld


def loader_over(n, batch=8, cfg=None, epochs=5, **loader_kw):
    ds = IdDataset(n)
    cfg = {**PRUNE_FROM_THE_START, **(cfg or {})}
    return EpochSiftingDataloader(cfg, DataLoader(ds, batch_size=batch, shuffle=True, **loader_kw), epochs)


# -- the order of an epoch --------------------------------------------------------------


def increasing_share(ids):
    return sum(1 for a, b in zip(ids, ids[1:]) if b > a) / (len(ids) - 1)


def test_sifted_epochs_train_in_a_random_order_not_by_id():
    loader = loader_over(200, batch=10, cfg={**PRUNE_FROM_THE_START, "seed": 3, "kept_share": 0.5}, epochs=4)
    orders = []
    for _ in range(3):
        flat = []
        for x, _y in loader:
            flat += ids_of(x)
            loader.weighted_loss(oracle_loss(x))
        orders.append(flat)
    assert [h["kind"] for h in loader.history] == ["warmup", "sift", "sift"]
    for flat in orders[1:]:
        assert len(flat) == 100
        assert 0.35 < increasing_share(flat) < 0.65  # a sorted (or reversed) order gives 1 (or 0)
    common = set(orders[1]) & set(orders[2])
    first = [i for i in orders[1] if i in common]
    second = [i for i in orders[2] if i in common]
    assert first != second  # each epoch its own order, not a fixed one


# -- the user's DataLoader settings ------------------------------------------------------


class TaggedDataset(Dataset):
    """Sample ``i`` is ``([i], tag)``: ``tag`` is 0 unless the worker init function set it."""

    def __init__(self, n):
        self.n = n
        self.tag = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)]), torch.tensor(self.tag)


def init_worker(log_path, worker_id):
    get_worker_info().dataset.tag = 7
    with open(log_path, "a") as f:
        f.write(f"{worker_id}\n")


def test_the_users_worker_settings_reach_the_workers(tmp_path):
    log = tmp_path / "inits"
    context = multiprocessing.get_context("fork")
    source = DataLoader(
        TaggedDataset(24),
        batch_size=8,
        num_workers=1,
        worker_init_fn=functools.partial(init_worker, str(log)),
        persistent_workers=True,
        timeout=30,
        multiprocessing_context=context,
        prefetch_factor=3,
    )
    loader = EpochSiftingDataloader({**PRUNE_FROM_THE_START, "seed": 1, "warmup_epochs": 3}, source, num_epochs=3)
    tags = []
    for _ in range(3):
        for x, tag in loader:
            tags += tag.tolist()
            loader.weighted_loss(x[:, 0] / 24)
    assert tags == [7] * 72  # every batch was loaded by a worker the user's init function set up
    assert log.read_text().splitlines() == ["0"]  # persistent: one worker, started once for 3 epochs
    ours = loader._loader
    assert ours is not source and ours.batch_sampler is not source.batch_sampler
    assert (ours.timeout, ours.prefetch_factor, ours.persistent_workers) == (30, 3, True)
    assert ours.multiprocessing_context is context


def test_pin_memory_is_kept():
    source = DataLoader(IdDataset(10), batch_size=5, pin_memory=True)
    loader = EpochSiftingDataloader({**PRUNE_FROM_THE_START, "seed": 1}, source, num_epochs=2)
    assert loader._loader.pin_memory is True
    assert loader._loader.pin_memory_device == source.pin_memory_device
    plain = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 1}, DataLoader(IdDataset(10), batch_size=5), num_epochs=2
    )
    assert plain._loader.pin_memory is False


# -- the noise guard over several epochs ---------------------------------------------------


def run_epochs(loader, epochs, loss_of):
    """``epochs`` epochs; ``loss_of(ids, epoch)`` gives the losses. Returns the ids trained per epoch."""
    trained = []
    for _ in range(epochs):
        ids = []
        for x, _y in loader:
            batch = torch.tensor(ids_of(x))
            loader.weighted_loss(loss_of(batch, loader.epoch - 1))
            ids += batch.tolist()
        trained.append(ids)
    return trained


def test_a_guard_streak_resets_when_the_loss_falls_and_only_trained_samples_update():
    """Samples 0 and 1 are always high, sample 2 only in the first epoch: after two epochs
    0 and 1 reach the streak of 2 and are left out; 2 falls below the quantile and starts
    over. Left out, 0 and 1 are not trained, so their old high scores extend nothing. (The
    0.9 quantile of 40 scores is 1.0, which the others tie with: only those at 10.0 are above.)"""

    def loss_of(ids, epoch):
        high = (ids < 2) | ((ids == 2) & (epoch == 0))
        return torch.where(high, torch.tensor(10.0), torch.tensor(1.0))

    loader = loader_over(
        40,
        cfg={
            **PRUNE_FROM_THE_START,
            "seed": 4,
            "warmup_epochs": 2,
            "kept_share": 0.5,
            "noise_guard_epochs": 2,
            "noise_guard_quantile": 0.9,
        },
    )
    run_epochs(loader, 1, loss_of)
    loader.start_epoch()  # epoch 1 (warm-up): the streaks of epoch 0
    assert loader.guard.streak[:3].tolist() == [1, 1, 1]
    run_epochs(loader, 1, loss_of)
    loader.start_epoch()  # epoch 2 (sifted)
    assert loader.guard.streak[:3].tolist() == [2, 2, 0]
    assert loader.plan.excluded == 2 and not {0, 1} & set(loader.plan.order.tolist())
    trained = run_epochs(loader, 1, loss_of)
    assert not {0, 1} & set(trained[0])
    loader.start_epoch()  # epoch 3 (sifted): 0 and 1 were not trained in epoch 2
    assert loader.guard.streak[:2].tolist() == [2, 2]
    assert loader.plan.excluded == 2
    assert loader.metrics()["excluded_by_guard"] == 2


def test_the_guard_counts_the_epochs_a_sample_trained_in_with_drop_last():
    """Distinct losses and a quantile as low as it goes: every score but the lowest (sample 0's)
    is above it, so a streak counts the epochs its sample was trained in: with ``drop_last``
    the samples of each epoch's dropped short batch are not."""
    cfg = {
        **PRUNE_FROM_THE_START,
        "seed": 2,
        "warmup_epochs": 3,
        "noise_guard_epochs": 10,
        "noise_guard_quantile": 0.01,
    }
    loader = loader_over(45, cfg=cfg, epochs=6, drop_last=True)
    trained = run_epochs(loader, 3, lambda ids, e: ids.float() + 1.0)
    assert [len(t) for t in trained] == [40, 40, 40]
    loader.start_epoch()
    expected = torch.zeros(45, dtype=torch.int32)
    scores = torch.full((45,), float("nan"))
    for ids in trained:  # each epoch's opening: the lowest score of all is the threshold, not above it
        scores[ids] = torch.tensor(ids).float() + 1.0
        above = scores[ids] > scores.nan_to_num(float("inf")).min()
        expected[ids] = torch.where(above, expected[ids] + 1, 0).int()
    assert (expected > 0).sum() >= 40 and ((expected > 0) & (expected < 3)).any()  # some sample was in a dropped batch
    assert torch.equal(loader.guard.streak, expected)


# -- counts --------------------------------------------------------------------------------


@pytest.mark.parametrize("n, share, kept", [(45, 0.5, 23), (10, 0.25, 3), (30, 0.05, 2)])
def test_the_budget_rounds_half_up(n, share, kept):
    loader = loader_over(n, batch=4, cfg={**PRUNE_FROM_THE_START, "seed": 1, "kept_share": share})
    run_epochs(loader, 1, lambda ids, e: oracle(ids))
    assert len(loader) == -(-kept // 4)
    plan = loader.start_epoch()
    assert plan.kind == "sift" and plan.kept == kept


def test_a_tiny_budget_still_trains_a_sample():
    loader = loader_over(20, batch=4, cfg={**PRUNE_FROM_THE_START, "seed": 1, "kept_share": 0.01})
    assert loader.planned_steps() == 5 + 4 * 1  # num_epochs 5: no annealing epoch
    trained = run_epochs(loader, 2, lambda ids, e: ids.float() + 1)
    assert len(trained[1]) == 1


def test_an_unbudgeted_epoch_of_few_expected_samples_trains_a_batch():
    cfg = {**PRUNE_FROM_THE_START, "seed": 1, "beta_value": 8.0, "min_keep_probability": 0.01}  # about 3 of 30 expected
    loader = loader_over(30, batch=8, cfg=cfg)
    trained = run_epochs(loader, 2, lambda ids, e: ids.float() + 1)
    assert len(trained[1]) == 8


def test_drop_last_counts_whole_batches_of_full_and_budgeted_epochs():
    loader = loader_over(
        45, batch=8, cfg={**PRUNE_FROM_THE_START, "seed": 1, "kept_share": 0.5}, epochs=4, drop_last=True
    )
    assert len(loader) == 5  # 45 // 8
    assert loader.planned_steps() == 5 + 3 * 2  # sifted epochs: 23 samples, 2 whole batches
    trained = run_epochs(loader, 4, lambda ids, e: ids.float() + 1)
    assert [len(t) for t in trained] == [40, 16, 16, 16]
    assert loader.counts["batches_recorded"] == 11


# -- the weights metrics() reports -----------------------------------------------------------


def test_mean_and_max_weight_are_those_of_the_trained_samples():
    """The weight ``weighted_loss`` applies to each sample, read from its gradient
    (``w_i / n``), averaged and maximised over the epoch: what ``metrics()`` reports."""
    loader = loader_over(120, batch=10, cfg={**PRUNE_FROM_THE_START, "seed": 5, "beta_value": 2.0}, epochs=5)
    measured = []  # (mean, max) of the weights applied in each epoch
    for epoch in range(3):
        applied = []
        for x, _y in loader:
            losses = oracle_loss(x).requires_grad_()
            loader.weighted_loss(losses).backward()
            applied.append(losses.grad * len(losses))
        w = torch.cat(applied)
        measured.append((float(w.mean()), float(w.max())))
        m = loader.metrics()
        assert m["mean_weight"] == pytest.approx(measured[-1][0], rel=1e-5)
        assert m["max_weight"] == pytest.approx(measured[-1][1], rel=1e-5)
        # The history keeps every epoch's own weights, each entry those applied in its epoch.
        assert [e["epoch"] for e in m["epochs"]] == list(range(epoch + 1))
        assert [(e["mean_weight"], e["max_weight"]) for e in m["epochs"]] == [
            (pytest.approx(mean, rel=1e-5), pytest.approx(top, rel=1e-5)) for mean, top in measured
        ]
        if epoch > 0:
            assert m["epoch_kind"] == "sift" and m["mean_weight"] > 1.0
    assert measured[1] != measured[2]  # two sifted epochs with weights of their own: the entries can tell them apart


# -- the merge over data-parallel ranks (two ranks simulated by threads) ------------------


def per_epoch_loss(ids, epoch):
    """A loss that differs from one epoch to the next: the latest one is recognisable."""
    return (ids.double() * 7919 % 101 / 101 + 1.0 + 10.0 * epoch).float()


def ddp_loaders(monkeypatch, world, cfg, n=50, batch=4, epochs=6):
    """``world`` loaders, one per simulated rank, over the same shuffled DataLoader settings."""
    import neuron_sift.epoch.loader as loader_module
    from neuron_sift.shared.ranks import RankGroup

    w = ThreadWorld(world)

    class Ranks(RankGroup):
        def __init__(self, enabled, device):
            self.active, self.rank, self.world_size, self.device = True, w.local.rank, world, torch.device("cpu")
            self.received_bytes = 0

    monkeypatch.setattr(torch.distributed, "all_reduce", w.all_reduce)
    monkeypatch.setattr(torch.distributed, "all_gather", w.all_gather)
    monkeypatch.setattr(loader_module, "RankGroup", Ranks)

    def new():
        return EpochSiftingDataloader(cfg, DataLoader(IdDataset(n), batch_size=batch, shuffle=True), num_epochs=epochs)

    return w, w.run([new] * world)


def latest_losses(records, n):
    """Each sample's loss of the latest epoch it was recorded in: ``records`` holds
    (epoch, ids, losses, ...) of every rank."""
    latest = torch.full((n,), float("nan"))
    for record in sorted(records, key=lambda r: r[0]):
        latest[record[1]] = record[2]
    return latest


def test_merged_scores_are_each_samples_latest_loss_never_a_sum(monkeypatch):
    """A sample trained on one rank in one epoch and on the other in the next gets the loss
    of the later epoch; the ranks plan from the same merged scores."""
    world, loaders = ddp_loaders(
        monkeypatch, 2, {**PRUNE_FROM_THE_START, "seed": 3, "warmup_epochs": 2, "kept_share": 0.6}
    )
    records, merged = [], [[], []]

    def rank_loop(rank):
        loader = loaders[rank]

        def loop():
            for _ in range(4):
                loader.start_epoch()
                merged[rank].append(loader.tables.snapshot())
                for x, _y in loader:
                    ids = torch.tensor(ids_of(x))
                    losses = per_epoch_loss(ids, loader.epoch - 1)
                    loader.weighted_loss(losses)
                    records.append((loader.epoch - 1, ids, losses, rank))

        return loop

    world.run([rank_loop(0), rank_loop(1)])
    assert world.merges == 3  # at the start of epochs 1, 2, 3
    for epoch in (1, 2, 3):
        expected = latest_losses([r for r in records if r[0] < epoch], 50)
        for rank in range(2):
            assert torch.equal(merged[rank][epoch], expected), (epoch, rank)

    def trained(epoch, rank):
        return {i for e, ids, _, r in records if (e, r) == (epoch, rank) for i in ids.tolist()}

    assert trained(0, 0) & trained(1, 1) and trained(1, 0) & trained(2, 1)  # samples that changed rank


def test_carried_batches_are_merged_and_the_newer_epoch_wins(monkeypatch):
    """A look-ahead of two batches (gradient accumulation): each epoch's last two batches get
    their losses after the next epoch was planned. Those late losses reach every rank at the
    merge after, where a loss of the newer epoch, recorded on any rank, wins over them."""
    world, loaders = ddp_loaders(
        monkeypatch, 2, {**PRUNE_FROM_THE_START, "seed": 5, "warmup_epochs": 2, "kept_share": 0.4}
    )
    records, merged, orders = [], [[], []], {}

    def rank_loop(rank):
        loader = loaders[rank]

        def record(x, epoch):
            ids = torch.tensor(ids_of(x))
            losses = per_epoch_loss(ids, epoch)
            loader.weighted_loss(losses)
            records.append((epoch, ids, losses, loader.epoch))  # loader.epoch: merges before it

        def loop():
            pending = deque()
            for _ in range(4):
                for x, _y in loader.iter_epoch(carry_pending=True):
                    epoch = loader.epoch - 1
                    if not pending or pending[-1][1] != epoch:  # the epoch's first batch: just planned
                        merged[rank].append(loader.tables.snapshot())
                        orders[epoch] = set(loader.plan.order.tolist())
                    pending.append((x, epoch))
                    if len(pending) > 2:
                        record(*pending.popleft())
            while pending:
                record(*pending.popleft())

        return loop

    world.run([rank_loop(0), rank_loop(1)])
    checked = {"late": 0, "newer over late": 0}
    for m in (2, 3):  # the merges that planned the sifted epochs 2 and 3
        late = {}  # epoch m - 2's losses recorded after the merge that planned epoch m - 1
        for e, ids, losses, merges in records:
            if e == m - 2 and merges == m:
                late.update(zip(ids.tolist(), losses.tolist()))
        newer = {}  # epoch m - 1's losses recorded before merge m
        for e, ids, losses, merges in records:
            if e == m - 1 and merges <= m:
                newer.update(zip(ids.tolist(), losses.tolist()))
        only_late = [i for i in late if i not in orders[m - 1]]
        checked["late"] += len(only_late)
        checked["newer over late"] += len([i for i in late if i in newer])
        for rank in range(2):
            scores = merged[rank][m]
            assert all(scores[i] == late[i] for i in only_late), (m, rank)
            assert all(scores[i] == newer[i] for i in newer), (m, rank)
    assert checked["late"] and checked["newer over late"], checked  # both cases occurred
