"""EpochSiftingDataloader on the CPU: selection at the sampler, the user's settings, pairing
of losses with their samples (workers, prefetching, micro-batches), errors, lengths."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader, LossOutputException, SiftConfigValidationException
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, Prefetcher, ids_of, oracle, oracle_loss


def make(n=300, batch=16, epochs=6, cfg=None, **loader_kw):
    ds = IdDataset(n)
    dl = DataLoader(ds, batch_size=batch, shuffle=True, **loader_kw)
    cfg = {"seed": 3, **PRUNE_FROM_THE_START, **(cfg or {})}
    return ds, EpochSiftingDataloader(cfg, dl, num_epochs=epochs)


def run_epoch(loader, wrap=None):
    """One epoch with oracle losses; returns the ids of every batch in training order."""
    seen = []
    it = wrap(loader) if wrap else loader
    for x, _y in it:
        seen.append(ids_of(x))
        loader.weighted_loss(oracle_loss(x))
    return seen


def assert_scores_are_oracle(loader, trained_ids):
    scores = loader.tables.snapshot()
    ids = torch.tensor(sorted(set(trained_ids)))
    assert torch.allclose(scores[ids], oracle(ids))
    others = torch.ones(loader.n, dtype=torch.bool)
    others[ids] = False
    assert torch.isnan(scores[others]).all()


def test_a_plain_loop_trains_the_plan_in_the_users_batches():
    ds, loader = make(epochs=8, cfg={"kept_share": 0.4})
    planned = loader.planned_steps()
    total, all_ids = 0, []
    for epoch in range(8):
        ds.loaded.clear()
        loader.start_epoch()
        it = iter(loader)
        plan, length = loader.plan, len(loader)
        batches = run_epoch(loader, wrap=lambda _: it)
        flat = [i for b in batches for i in b]
        assert flat == plan.order.tolist()  # the planned samples, in the planned order
        assert sorted(ds.loaded) == sorted(flat)  # skipped samples were never loaded
        assert all(len(b) == 16 for b in batches[:-1])
        assert len(batches) == length
        total += len(batches)
        all_ids += flat
        kind = ["warmup"] + ["sift"] * 6 + ["anneal"]
        kind = kind[epoch]
        assert plan.kind == kind
        assert plan.kept == (300 if kind != "sift" else 120)
    assert total == planned  # the schedule length is exact with a budget
    assert_scores_are_oracle(loader, all_ids)


def test_weighted_loss_value_and_gradient():
    ds, loader = make(cfg={"kept_share": 0.3})
    run_epoch(loader)  # warm-up: every sample scored
    loader.start_epoch()
    it = iter(loader)
    for x, _y in it:
        ids = torch.tensor(ids_of(x))
        losses = oracle_loss(x).requires_grad_()
        out = loader.weighted_loss(losses)
        w = 1 / loader.plan.inclusion[ids]  # each sample's inverse keep probability
        assert out.item() == pytest.approx(float((w * oracle(ids)).sum() / len(ids)), rel=1e-6)
        out.backward()
        assert torch.allclose(losses.grad, w / len(ids))
        assert w.min() >= 1.0
    assert loader.plan.kind == "sift" and float(loader.plan.inclusion[loader.plan.order].min()) < 1


@pytest.mark.parametrize("workers, persistent", [(2, False), (2, True)])
def test_workers_and_persistent_workers_pair_correctly(workers, persistent):
    ds, loader = make(n=200, batch=8, epochs=4, num_workers=workers, persistent_workers=persistent, prefetch_factor=3)
    trained = []
    for _ in range(4):
        for b in run_epoch(loader):
            trained += b
    assert_scores_are_oracle(loader, trained)
    assert loader.metrics()["unpaired_batches"] == 0


def test_a_prefetching_wrapper_around_the_loader_pairs_correctly():
    ds, loader = make(n=200, batch=8, epochs=4)
    trained = []
    for _ in range(4):
        for b in run_epoch(loader, wrap=lambda l: Prefetcher(l, depth=4)):
            trained += b
    assert_scores_are_oracle(loader, trained)


def test_a_wrapper_given_as_source_is_kept_around_the_planned_loader():
    class Wrapper:
        def __init__(self, loader):
            self._loader = loader

        def __iter__(self):
            for x, y in self._loader:
                yield x * 1.0, y  # a transform in the wrapper, like a device transfer

    ds = IdDataset(100)
    loader = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 1}, Wrapper(DataLoader(ds, batch_size=10)), num_epochs=3
    )
    assert isinstance(loader._loader, Wrapper)
    trained = []
    for _ in range(3):
        trained += [i for b in run_epoch(loader) for i in b]
    assert_scores_are_oracle(loader, trained)


def test_micro_batches_with_partial():
    ds, loader = make(n=64, batch=16, epochs=2)
    trained = []
    for x, _y in loader:
        for part in torch.tensor_split(x, 3):
            loader.weighted_loss(oracle_loss(part), partial=True)
        trained += ids_of(x)
    assert loader.metrics()["batches_recorded"] == 4
    assert_scores_are_oracle(loader, trained)


def test_pairing_errors_are_clear_and_record_nothing():
    ds, loader = make(n=64, batch=16, epochs=2)
    it = iter(loader)
    x, y = next(it)
    with pytest.raises(
        LossOutputException, match="got 15 losses but the batch they belong to has 16 samples.*partial=True"
    ):
        loader.weighted_loss(oracle_loss(x)[:15])
    with pytest.raises(LossOutputException, match="got 17 losses"):
        loader.weighted_loss(torch.cat([oracle_loss(x), oracle_loss(x[:1])]))
    with pytest.raises(LossOutputException, match=r"shape \[n\]"):
        loader.weighted_loss(torch.zeros(16, 2))
    with pytest.raises(LossOutputException, match="floating-point"):
        loader.weighted_loss(torch.zeros(16, dtype=torch.long))
    assert torch.isnan(loader.tables.snapshot()).all()
    losses = oracle_loss(x)
    loader.weighted_loss(losses)
    with pytest.raises(LossOutputException, match="same loss tensor twice"):
        loader.weighted_loss(losses)
    with pytest.raises(LossOutputException, match="no yielded batch is waiting"):
        loader.weighted_loss(oracle_loss(x))  # a second loss for the same batch
    with pytest.raises(LossOutputException, match="tensor of per-sample losses"):
        loader.weighted_loss([1.0] * 16)


def test_a_batch_without_its_loss_is_counted_at_the_next_epoch(caplog):
    """The epoch's last batch never gets its loss (nothing is yielded after it, so nothing
    can be misattributed): the next epoch forgets it, counts it and names it."""
    ds, loader = make(n=64, batch=16, epochs=3)
    for i, (x, _y) in enumerate(loader):
        if i != 3:
            loader.weighted_loss(oracle_loss(x))
    with caplog.at_level("WARNING"):
        for x, _y in loader:
            loader.weighted_loss(oracle_loss(x))
    assert loader.metrics()["unpaired_batches"] == 1
    assert "1 yielded batch(es) never got their losses through weighted_loss (batch 3 of epoch 0" in caplog.text


def test_nonfinite_losses_are_counted_not_recorded_and_stay_visible():
    ds, loader = make(n=32, batch=8, epochs=2)
    it = iter(loader)
    x, y = next(it)
    losses = oracle_loss(x)
    losses[1] = float("nan")
    losses[5] = float("inf")
    out = loader.weighted_loss(losses)
    assert math.isnan(out.item())
    scores = loader.tables.snapshot()
    ids = ids_of(x)
    assert math.isnan(scores[ids[1]]) and math.isnan(scores[ids[5]])
    assert scores[ids[0]] == pytest.approx(float(oracle(torch.tensor([ids[0]]))))
    assert loader.metrics()["num_nonfinite_losses"] == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_low_and_high_precision_losses(dtype):
    ds, loader = make(n=32, batch=8, epochs=2)
    for x, _y in loader:
        out = loader.weighted_loss(oracle_loss(x).to(dtype))
        assert out.dtype == torch.promote_types(dtype, torch.float32)
    assert not torch.isnan(loader.tables.snapshot()).any()


def test_user_settings_are_kept():
    ds = IdDataset(101)
    seen_collate = []

    def collate(samples):
        seen_collate.append(len(samples))
        xs = torch.stack([s[0] for s in samples])
        return {"x": xs, "y": torch.stack([s[1] for s in samples])}

    dl = DataLoader(
        ds, batch_size=10, shuffle=True, drop_last=True, collate_fn=collate, generator=torch.Generator().manual_seed(77)
    )
    loader = EpochSiftingDataloader({}, dl, num_epochs=3)
    assert loader.seed == 77  # the user's generator seeds the plans when the config has no seed
    n, length = 0, len(loader)
    for batch in loader:
        assert set(batch) == {"x", "y"} and batch["x"].shape == (10, 2)
        loader.weighted_loss(oracle_loss(batch["x"]))
        n += 1
    assert n == 10 == length  # drop_last: the short batch is dropped
    assert set(seen_collate) == {10}


def test_the_configs_seed_wins_over_the_dataloaders_generator():
    """Two ways to seed the plans: the config's seed, when given, whatever generator the
    DataLoader has (its seed is used only when the config has none)."""
    dl = DataLoader(IdDataset(40), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(77))
    assert EpochSiftingDataloader({**PRUNE_FROM_THE_START, "seed": 5}, dl, num_epochs=3).seed == 5
    assert EpochSiftingDataloader({}, dl, num_epochs=3).seed == 77


def test_unsupported_sources_name_what_is_supported():
    class Stream(IterableDataset):
        def __iter__(self):
            yield from range(3)

    class NoLen(Dataset):
        def __getitem__(self, i):
            return i

    with pytest.raises(TypeError, match="IterableDataset"):
        EpochSiftingDataloader({}, DataLoader(Stream(), batch_size=2))
    with pytest.raises(TypeError, match="has no length"):
        EpochSiftingDataloader({}, DataLoader(NoLen(), batch_size=2))
    with pytest.raises(TypeError, match="map-style dataset"):
        EpochSiftingDataloader({}, [1, 2, 3])
    with pytest.raises(ValueError, match="in_order"):
        EpochSiftingDataloader({}, DataLoader(IdDataset(10), batch_size=2, num_workers=1, in_order=False))
    with pytest.raises(TypeError, match="no batch size"):
        EpochSiftingDataloader({}, DataLoader(IdDataset(10), batch_size=None))
    with pytest.raises(SiftConfigValidationException):
        EpochSiftingDataloader({"policy": "x"}, DataLoader(IdDataset(10), batch_size=2))
    with pytest.raises(ValueError, match="num_epochs"):
        EpochSiftingDataloader({}, DataLoader(IdDataset(10), batch_size=2), num_epochs=0)
    with pytest.raises(ValueError, match="backend"):
        EpochSiftingDataloader({}, DataLoader(IdDataset(10), batch_size=2), backend="tpu")


def test_lengths_of_unbudgeted_epochs_are_whole_batches_and_exact_once_planned():
    ds, loader = make(n=640, batch=32, epochs=5)
    assert len(loader) == 20  # warm-up: all data
    expected_total = loader.planned_steps()
    total = 0
    for _epoch in range(5):
        loader.start_epoch()
        it = iter(loader)
        planned = len(loader)
        got = len(run_epoch(loader, wrap=lambda _: it))
        assert got == planned
        total += got
        if loader.plan.kind == "sift":
            assert loader.plan.kept % 32 == 0
    share = EpochSiftConfig().expected_kept_share()
    assert abs(total - expected_total) <= 3
    assert expected_total == 20 + 4 * round(share * 640 / 32)  # 5 epochs: no annealing epoch


def test_planned_steps_arguments():
    ds, loader = make(n=100, batch=10, epochs=4, cfg={"kept_share": 0.5, "anneal_fraction": 0.25})
    assert loader.planned_steps() == 10 + 5 + 5 + 10
    assert loader.planned_steps(epochs=2) == 15
    it = iter(loader)
    for _ in range(3):
        x, y = next(it)
        loader.weighted_loss(oracle_loss(x))
    assert loader.planned_steps() == 7 + 5 + 5 + 10
    assert loader.planned_steps(epochs=1) == 7
    nolen = EpochSiftingDataloader({}, DataLoader(IdDataset(10), batch_size=2))
    with pytest.raises(ValueError, match="num_epochs"):
        nolen.planned_steps()
    with pytest.raises(ValueError, match="epochs must be"):
        loader.planned_steps(epochs=0)


def test_length_is_exact_with_a_budget_or_when_no_epoch_is_sifted():
    """Exact lengths need no scores: a budget fixes every sifted epoch's count, and a run
    whose epochs are all warm-up or annealing never sifts."""
    exact = {
        (cfg_share, epochs): EpochSiftingDataloader(
            {**PRUNE_FROM_THE_START, "seed": 0, "kept_share": cfg_share, "warmup_epochs": 1, "anneal_fraction": 0.5},
            DataLoader(IdDataset(20), batch_size=4),
            num_epochs=epochs,
        ).length_is_exact
        for cfg_share in (None, 0.5)
        for epochs in (None, 1, 2, 4)
    }
    assert exact == {
        (None, None): False,  # every epoch after the warm-up is sifted
        (None, 1): True,  # the warm-up only
        (None, 2): True,  # warm-up and annealing
        (None, 4): False,  # epoch 1 is sifted
        **{(0.5, e): True for e in (None, 1, 2, 4)},
    }


def test_training_reaches_the_model_and_metrics_report():
    torch.manual_seed(0)
    x = torch.randn(512, 6)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 0}, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), num_epochs=8
    )
    for _ in range(8):
        for xb, yb in loader:
            loss = loader.weighted_loss(F.cross_entropy(model(xb), yb, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
    acc = (model(x).argmax(1) == y).float().mean()
    assert acc > 0.9
    m = loader.metrics()
    assert m["scores_recorded"] == 512 and m["num_nonfinite_losses"] == 0
    kinds = [e["kind"] for e in m["epochs"]]
    assert kinds == ["warmup"] + ["sift"] * 6 + ["anneal"]
    assert all(0.3 < e["observed_kept_share"] < 0.7 for e in m["epochs"][1:-1])
    assert all(e["mean_weight"] > 1 for e in m["epochs"][1:-1])  # sifted epochs weigh losses by 1 / keep probability
    assert all(e["mean_weight"] == e["max_weight"] == 1 for e in (m["epochs"][0], m["epochs"][-1]))
    assert m["machinery_seconds"] > 0


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_a_stream_prefetching_across_epochs_keeps_pairs_and_weights(table):
    """ExactLengthLoader (the Trainer integration's stream) with a look-ahead of 3 batches, as the Trainer's
    gradient accumulation pulls them: batches of the previous epoch paired after the next
    epoch was planned get their own epoch's weights. (The losses change from epoch to epoch,
    so each epoch's keep probabilities, and weights, are its own.)"""
    from neuron_sift.integrations.schedules import ExactLengthLoader

    ds, loader = make(n=100, batch=8, epochs=5, cfg={"kept_share": 0.5, "score_table": table})
    stream = ExactLengthLoader(loader, loader.planned_steps() // 3)
    slots = loader.planner.slots  # the ids themselves, or the sharded table's slots (one rank: all samples)
    latest, checked, carried = {}, 0, 0
    for _ in range(3):
        it = iter(stream)
        while True:
            # each batch with the epoch it was yielded in and that epoch's weights (1 / keep probability)
            group = [(b, loader.epoch, loader.plan.weights) for _, b in zip(range(3), it)]
            if not group:
                break
            for (x, _y), epoch, weights in group:
                ids = torch.tensor(ids_of(x))
                losses = oracle(ids + 7 * epoch)
                out = loader.weighted_loss(losses)
                assert out.item() == pytest.approx(float((weights[slots(ids.numpy())] * losses).mean()), rel=1e-6)
                carried += epoch != loader.epoch
                latest.update(zip(ids.tolist(), losses.tolist()))
                checked += 1
    assert carried > 0  # some batches got their losses after the next epoch was planned
    ids = torch.tensor(sorted(latest))
    held = loader.tables.snapshot()[slots(ids.numpy())]
    assert torch.equal(held, torch.tensor([latest[i] for i in ids.tolist()]))
    assert loader.metrics()["unpaired_batches"] == 0
    assert checked == 3 * len(stream)


def test_an_iterator_never_advanced_plans_nothing_and_start_epoch_is_idempotent():
    ds, loader = make(n=64, batch=16, epochs=3)
    iter(loader)  # Lightning checks a loader this way
    assert loader.epoch == 0 and loader.plan is None
    plan = loader.start_epoch()
    assert loader.start_epoch() is plan and loader.epoch == 1 and len(loader) == 4
    run_epoch(loader)
    assert loader.epoch == 1
