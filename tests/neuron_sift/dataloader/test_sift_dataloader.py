"""Behaviour of SiftingDataloader that users rely on: the rule, accounting, delay, length, errors."""

import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import (
    LossImplementationNotProvidedException,
    LossOutputException,
    SiftConfigValidationException,
    SiftingDataloader,
)
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader, make_config, tiny_model

BETAS = [0.1, 0.25, 0.5, 1, 2, 3, 10, 100]


def make_loader(losses, batch_size=64, **cfg):
    return SiftingDataloader(
        sift_config=make_config(**cfg),
        orig_dataloader=loss_table_loader(losses, batch_size),
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )


def emitted_ids(loader, epochs=1):
    out = []
    for _ in range(epochs):
        for ids, _losses in loader:
            out.append(ids.tolist())
    return out


def check_invariants(loader):
    c = loader.counts
    assert c.num_orig_samples_seen == c.num_orig_samples_kept + c.num_orig_samples_sifted
    assert c.num_orig_samples_kept == c.num_samples_emitted + c.num_samples_pending + c.num_samples_dropped
    assert c.num_samples_dropped == 0  # only data-parallel agreement drops
    m = loader.metrics()
    delayed = c.num_orig_samples_seen - m["device_num_scored"]
    assert m["device_num_kept"] + delayed == c.num_orig_samples_kept


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
@pytest.mark.parametrize("beta", BETAS)
def test_kept_share_matches_documented_table(beta, mode):
    """On i.i.d. continuous losses the kept share is 100 / (1 + beta) within 1.5 points."""
    gen = torch.Generator().manual_seed(123)
    losses = torch.empty(24_000).exponential_(generator=gen)
    loader = make_loader(losses, batch_size=64, beta=beta, mode=mode, history=500)
    emitted_ids(loader)
    c = loader.counts
    share = 100.0 * c.num_orig_samples_kept / c.num_orig_samples_seen
    assert c.num_orig_samples_seen == 24_000
    assert abs(share - 100.0 / (1.0 + beta)) <= 1.5, share
    check_invariants(loader)


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_prefers_high_losses(mode):
    losses = torch.rand(6400, generator=torch.Generator().manual_seed(1))
    loader = make_loader(losses, beta=2.0, mode=mode)
    ids = [i for batch in emitted_ids(loader) for i in batch]
    kept_mean = losses[ids].mean().item()
    assert kept_mean > losses.mean().item() + 0.15  # E[loss | kept] = 0.75 for beta=2 vs 0.5


def test_history_filling_rule():
    """First scored batch is kept whole (empty history); later ones rank against what is there."""
    losses = torch.tensor([5.0, 6.0, 7.0, 8.0] + [1.0, 2.0, 3.0, 4.0] * 2)
    loader = make_loader(losses, batch_size=4, beta=1000.0, history=8)
    emitted = emitted_ids(loader)
    # Batch 1: history empty -> percentile 1 -> all kept. Batch 2: every loss is below all
    # of batch 1 -> percentile 0 -> none kept. Batch 3: ranked against 8 entries; 4.0 has
    # percentile 4/8 = 0.5 -> 0.5**1000 ~ 0 -> none kept.
    assert emitted == [[0, 1, 2, 3]]
    assert loader.metrics()["history_fill"] == 8
    assert loader.counts.num_orig_samples_kept == 4


def pending_ids(loader):
    batch = loader.pending_batch()
    return [] if batch is None else batch.to_user()[0].tolist()


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_nothing_lost_or_duplicated_across_epochs(mode):
    """Every kept sample is emitted exactly once; leftovers are carried into the next epoch first."""
    n, b = 1000, 32  # 1000 % 32 != 0: a short last batch every epoch
    losses = torch.rand(n, generator=torch.Generator().manual_seed(2))
    loader = make_loader(losses, batch_size=b, beta=1.0, mode=mode, history=100)
    carried = []
    for _ in range(4):
        kept_before = loader.counts.num_orig_samples_kept
        batches = emitted_ids(loader)
        assert all(len(x) == b for x in batches)
        flat = [i for x in batches for i in x]
        assert flat[: len(carried)] == carried
        pending = pending_ids(loader)
        this_epoch = flat[len(carried) :] + pending
        assert len(set(this_epoch)) == len(this_epoch)  # a sample is kept at most once per epoch
        assert len(this_epoch) == loader.counts.num_orig_samples_kept - kept_before
        assert len(pending) == loader.counts.num_samples_pending < b
        carried = pending
        check_invariants(loader)
    assert loader.counts.num_orig_samples_seen == 4 * n


def test_carry_over_is_emitted_first_in_next_epoch():
    losses = torch.arange(10, dtype=torch.float32)
    # beta tiny -> nearly everything kept; batch 4 over 10 samples: 3 source batches.
    loader = make_loader(losses, batch_size=4, beta=1e-9, history=50, mode="fixed")
    first = emitted_ids(loader)
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.counts.num_samples_pending == 2
    second = emitted_ids(loader)
    assert second[0] == [8, 9, 0, 1]
    assert loader.counts.num_samples_pending == 0
    check_invariants(loader)


def test_sift_delay_passes_batches_through_without_scoring():
    losses = torch.rand(640)
    loader = make_loader(losses, batch_size=64, beta=3.0, delay=3)
    source = list(loader.orig_dataloader)
    out = list(loader)
    for got, want in zip(out[:3], source[:3]):
        assert torch.equal(got[0], want[0])
    assert loader.loss_impl.calls == 10 - 3
    assert loader.counts.num_source_batches_delayed == 3
    # Second epoch: the delay is not repeated.
    list(loader)
    assert loader.loss_impl.calls == 20 - 3


def test_repeat_delay_per_epoch():
    losses = torch.rand(640)
    loader = make_loader(losses, batch_size=64, beta=3.0, delay=2, repeat=True)
    list(loader)
    list(loader)
    assert loader.counts.num_source_batches_delayed == 4
    assert loader.loss_impl.calls == 20 - 4


@pytest.mark.parametrize("delay,repeat", [(0, False), (3, False), (2, True)])
@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("mode", ["fixed", "topk"])
def test_the_exact_modes_length_is_exact(beta, delay, repeat, mode):
    losses = torch.rand(1000)
    loader = make_loader(losses, batch_size=48, beta=beta, mode=mode, delay=delay, repeat=repeat)
    for _ in range(3):
        planned = len(loader)
        assert planned == loader.estimated_length()
        got = len(emitted_ids(loader))
        assert got == planned


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
def test_probabilistic_length_is_a_close_estimate(beta):
    """len() is the expected count; over 5 epochs the emitted total stays within 2%."""
    loader = make_loader(torch.rand(5000), batch_size=50, beta=beta)
    assert not loader.length_is_exact
    planned, got = 0, 0
    for _ in range(5):
        planned += len(loader)
        got += len(emitted_ids(loader))
    assert abs(got - planned) <= max(2, 0.02 * planned), (got, planned)


def test_length_needs_a_sized_source():
    loader = SiftingDataloader(
        sift_config=make_config(),
        orig_dataloader=iter([]),
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )
    with pytest.raises(TypeError, match="no length"):
        len(loader)


def test_fixed_mode_keeps_exactly_k_per_batch():
    losses = torch.rand(64 * 10 + 10)
    loader = make_loader(losses, batch_size=64, beta=3.0, mode="fixed")
    emitted_ids(loader)
    # 10 full batches keep 16 each; the short batch of 10 keeps round(10/4) = round(2.5) = 3.
    assert loader.counts.num_orig_samples_kept == 10 * 16 + 3


def test_topk_mode_keeps_the_highest_losses_of_every_source_batch():
    losses = torch.rand(64 * 10 + 10, generator=torch.Generator().manual_seed(4))
    loader = make_loader(losses, batch_size=64, beta=3.0, mode="topk")
    assert loader.length_is_exact and len(loader) == 2  # (10 * 16 + 3) // 64
    kept = {i for batch in emitted_ids(loader) for i in batch} | set(pending_ids(loader))
    assert loader.counts.num_orig_samples_kept == 10 * 16 + 3  # the same counts as fixed mode
    for start, k in [(64 * j, 16) for j in range(10)] + [(640, 3)]:
        block = losses[start : start + 64]
        want = {start + int(i) for i in torch.topk(block, k).indices}
        assert {i for i in kept if start <= i < start + block.numel()} == want


@pytest.mark.parametrize("mode", ["fixed", "topk"])
def test_the_exact_modes_that_keep_nothing_are_an_error(mode):
    loader = make_loader(torch.rand(10), batch_size=1, beta=3.0, mode=mode)
    with pytest.raises(SiftConfigValidationException, match=f"selection_mode='{mode}'"):
        list(loader)


@pytest.mark.parametrize("mode,beta", [("probabilistic", 1.0), ("fixed", 0.5)])
def test_batch_size_one(mode, beta):
    loader = make_loader(torch.rand(200), batch_size=1, beta=beta, mode=mode)
    batches = emitted_ids(loader)
    assert all(len(b) == 1 for b in batches)
    assert loader.counts.num_orig_samples_kept == len(batches)
    check_invariants(loader)


def test_empty_source_loader_yields_nothing():
    loader = make_loader(torch.rand(0), batch_size=8)
    assert list(loader) == []
    assert loader.counts.num_orig_samples_seen == 0


def test_dataset_smaller_than_one_batch():
    loader = make_loader(torch.rand(5), batch_size=8, beta=1e-9)
    assert list(loader) == []  # 5 kept samples wait for a full batch of 8
    assert loader.counts.num_samples_pending == 5


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_nonfinite_losses_are_kept_and_never_recorded(mode, caplog):
    losses = torch.rand(256)
    losses[[3, 70, 140]] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    loader = make_loader(losses, batch_size=64, beta=3.0, mode=mode, history=64)
    with caplog.at_level(logging.WARNING, logger="neuron_sift.dataloader.sift_dataloader"):
        ids = [i for b in emitted_ids(loader, epochs=2) for i in b]
    pending = pending_ids(loader)
    for bad in (3, 70, 140):
        assert ids.count(bad) + pending.count(bad) == 2  # kept in both epochs
    assert torch.isfinite(loader.sifter.state.history).all()
    assert loader.counts.num_nonfinite_losses == 6
    assert loader.metrics()["device_num_nonfinite"] == 6
    assert "non-finite loss" in caplog.text


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_nonfinite_warnings_are_rate_limited_with_exact_counts(mode, caplog):
    """A diverged run: every source batch has non-finite losses. The first is logged in
    full, then a summary per 100 source batches and one per epoch; the counts stay exact."""
    losses = torch.rand(8 * 250)
    losses[::8] = float("nan")  # one per source batch of 8
    loader = make_loader(losses, batch_size=8, beta=1.0, mode=mode, history=64)
    with caplog.at_level(logging.WARNING, logger="neuron_sift.dataloader.sift_dataloader"):
        emitted_ids(loader, epochs=2)
    lines = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert loader.counts.num_nonfinite_losses == 500
    assert len(lines) <= 1 + 500 // 100 + 2, lines
    assert "further occurrences are summarised" in lines[0]
    assert sum(int(line.split()[0]) for line in lines) == 500  # every occurrence in some line


def test_same_seed_same_selection_and_different_seed_differs():
    losses = torch.rand(2000, generator=torch.Generator().manual_seed(5))
    a = emitted_ids(make_loader(losses, beta=1.0, seed=7))
    b = emitted_ids(make_loader(losses, beta=1.0, seed=7))
    c = emitted_ids(make_loader(losses, beta=1.0, seed=8))
    assert a == b
    assert a != c


def test_seed_none_follows_torch_manual_seed():
    losses = torch.rand(2000, generator=torch.Generator().manual_seed(5))

    def run():
        cfg = make_config(beta=1.0)
        cfg.seed = None
        return emitted_ids(
            SiftingDataloader(
                sift_config=cfg,
                orig_dataloader=loss_table_loader(losses, 64),
                loss_impl=OracleLoss(),
                model=tiny_model(),
            )
        )

    torch.manual_seed(11)
    a = run()
    torch.manual_seed(11)
    assert run() == a


class _Recorder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.drop = torch.nn.Dropout(0.5)
        self.seen_training = []
        self.seen_grad = []

    def forward(self, x):
        self.seen_training.append(self.training)
        self.seen_grad.append(torch.is_grad_enabled())
        return self.drop(self.lin(x))


class _CE:
    """Duck-typed loss: no Loss base class."""

    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


def test_scoring_runs_in_eval_no_grad_and_restores_modes():
    model = _Recorder()
    model.train()
    model.drop.eval()  # a user's deliberate per-module mode must survive
    data = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    loader = SiftingDataloader(
        sift_config=make_config(beta=0.5),
        orig_dataloader=DataLoader(data, batch_size=8),
        loss_impl=_CE(),
        model=model,
    )
    for x, _y in loader:
        assert model.training and not model.drop.training
        assert x.shape == (8, 3)
    assert model.seen_training and not any(model.seen_training)
    assert not any(model.seen_grad)


def test_config_as_dict():
    loader = SiftingDataloader(
        sift_config={
            "beta_value": 1,
            "loss_history_length": 100,
            "loss_based_sift_config": {"sift_config": {"sift_delay": 0}},
        },
        orig_dataloader=loss_table_loader(torch.rand(256), 32),
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )
    emitted_ids(loader)
    assert loader.counts.num_orig_samples_seen == 256


def test_dict_batches_round_trip():
    class DictDS(torch.utils.data.Dataset):
        def __len__(self):
            return 100

        def __getitem__(self, i):
            return {"id": torch.tensor(i), "x": torch.randn(3), "text": f"s{i}", "loss": torch.rand(())}

    class DictLoss:
        def loss(self, model, transformed_batch, original_batch=None):
            return original_batch["loss"]

    loader = SiftingDataloader(
        sift_config=make_config(beta=1.0),
        orig_dataloader=DataLoader(DictDS(), batch_size=10),
        loss_impl=DictLoss(),
        model=tiny_model(),
    )
    ids = []
    for batch in loader:
        assert set(batch) == {"id", "x", "text", "loss"}
        assert batch["x"].shape == (10, 3)
        assert batch["text"] == [f"s{i}" for i in batch["id"].tolist()]
        ids += batch["id"].tolist()
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    assert len(ids) == loader.counts.num_samples_emitted


def test_dynamic_padding_error_names_the_source_batch():
    """Per-batch padding (a collator padding to the longest sample of each batch) cannot be
    joined across batches: the error says so and which source batch it came after."""

    def pad_to_longest(samples):
        longest = max(len(s) for s, _ in samples)
        x = torch.zeros(len(samples), longest)
        for i, (s, _) in enumerate(samples):
            x[i, : len(s)] = s
        return x, torch.stack([loss for _, loss in samples])

    data = [(torch.ones(3 if i < 32 else 1 + i % 7), torch.rand(())) for i in range(64)]  # batches 4+: width 7
    loader = SiftingDataloader(
        sift_config=make_config(beta=0.5),
        orig_dataloader=DataLoader(data, batch_size=8, collate_fn=pad_to_longest),
        loss_impl=_ReturnsLoss(lambda b: b[1]),
        model=tiny_model(),
    )
    with pytest.raises(Exception, match="pad every batch to the same shape") as info:
        list(loader)
    assert any("of epoch 0" in note and "source batch" in note for note in info.value.__notes__)  # 0-based


class _ReturnsLoss:
    def __init__(self, fn):
        self.fn = fn

    def loss(self, model, transformed_batch, original_batch=None):
        return self.fn(original_batch)


@pytest.mark.parametrize(
    "fn,match",
    [
        (lambda b: b[1].mean(), r"expected shape \[8\]"),
        (lambda b: torch.stack([b[1], b[1]], 1), r"expected shape \[8\]"),
        (lambda b: (b[1] * 10).long(), "floating-point"),
        (lambda b: b[1].tolist(), "torch.Tensor"),
        (lambda b: b[1].to("meta"), "on meta"),
    ],
)
def test_bad_loss_outputs_raise_clear_errors(fn, match):
    loader = SiftingDataloader(
        sift_config=make_config(),
        orig_dataloader=loss_table_loader(torch.rand(16), 8),
        loss_impl=_ReturnsLoss(fn),
        model=tiny_model(),
    )
    with pytest.raises(LossOutputException, match=match):
        list(loader)


def test_n_by_1_losses_are_accepted():
    loader = SiftingDataloader(
        sift_config=make_config(beta=1e-9),
        orig_dataloader=loss_table_loader(torch.ones(16), 8),  # ties: percentile 0.5, kept
        loss_impl=_ReturnsLoss(lambda b: b[1].unsqueeze(1)),
        model=tiny_model(),
    )
    assert len(list(loader)) == 2


def test_missing_loss_or_model():
    with pytest.raises(LossImplementationNotProvidedException):
        SiftingDataloader(sift_config=make_config(), orig_dataloader=[], model=tiny_model())
    with pytest.raises(TypeError, match="model"):
        SiftingDataloader(sift_config=make_config(), orig_dataloader=[], loss_impl=OracleLoss())


def test_user_errors_propagate_with_context():
    def boom(batch):
        raise KeyError("user bug")

    loader = SiftingDataloader(
        sift_config=make_config(),
        orig_dataloader=loss_table_loader(torch.rand(16), 8),
        loss_impl=_ReturnsLoss(boom),
        model=tiny_model(),
    )
    with pytest.raises(KeyError) as info:
        list(loader)
    assert any("source batch 0" in note for note in info.value.__notes__)


def test_documented_info_log_lines(caplog):
    loader = make_loader(torch.rand(640), batch_size=64, beta=1.0)
    loader.log_batch_data = True
    with caplog.at_level(logging.INFO, logger="neuron_sift.dataloader.sift_dataloader"):
        emitted_ids(loader)
    text = caplog.text
    assert all(r.name == "neuron_sift.dataloader.sift_dataloader" for r in caplog.records)
    for needle in [
        "num_orig_samples_seen: ",
        "num_orig_samples_kept: ",
        "Batch size for next sifted batch: 64",
        "sifted_batch_creation_latency: ",
        "func:transform latency: ",
        "func:calculate_relevance_values latency: ",
        "func:should_sift latency: ",
        "func:sift latency: ",
        "func:accumulate latency: ",
        "func:reverse_transform latency: ",
        "relevance_values: [",
        "relevance_values_kept: [",
    ]:
        assert needle in text, needle


def test_no_info_lines_without_log_level(caplog, monkeypatch):
    """Without INFO, the per-batch lines are neither emitted nor even formatted."""
    from neuron_sift.dataloader import sift_dataloader

    calls = []
    monkeypatch.setattr(sift_dataloader.logger, "info", lambda *args, **kw: calls.append(args))
    loader = make_loader(torch.rand(640), batch_size=64, beta=1.0)
    with caplog.at_level(logging.WARNING, logger="neuron_sift.dataloader.sift_dataloader"):
        assert emitted_ids(loader)
    assert "num_orig_samples_seen" not in caplog.text
    assert calls == []


@pytest.mark.parametrize("delay", [0, 5])
def test_fixed_mode_consumer_stopping_after_len_still_sees_every_sample(delay):
    """Lightning and the HF Trainer stop an epoch after len(loader) batches: the source
    batches after the last planned batch are scored before it is handed out."""
    import itertools

    n, b = 1000, 32
    losses = torch.rand(n, generator=torch.Generator().manual_seed(3))
    stopping = make_loader(losses, batch_size=b, beta=1.0, mode="fixed", delay=delay)
    draining = make_loader(losses, batch_size=b, beta=1.0, mode="fixed", delay=delay)
    for epoch in range(3):
        planned = len(stopping)
        a = [ids.tolist() for ids, _ in itertools.islice(iter(stopping), planned)]
        full = emitted_ids(draining)
        assert a == full and len(a) == planned
        assert stopping.counts.num_orig_samples_seen == (epoch + 1) * n
        assert stopping.counts == draining.counts


def test_counts_is_one_live_object_with_the_engines_nonfinite_count():
    """A reference to ``loader.counts`` taken before training reads the counts after it (the
    smart_sifting scripts keep one), and its non-finite count is the engine's counter."""
    losses = torch.rand(64)
    losses[[5, 40]] = float("nan")
    loader = make_loader(losses, batch_size=16, beta=1.0, mode="probabilistic", history=32)
    counts = loader.counts
    emitted_ids(loader, epochs=2)
    assert counts is loader.counts
    assert counts.num_source_batches == 8 and counts.num_orig_samples_seen == 128
    assert counts.num_nonfinite_losses == 4 == loader.sifter.num_nonfinite()
    assert counts.as_dict()["num_nonfinite_losses"] == 4
    assert list(counts.as_dict()) == list(counts.names())


def test_a_dropped_loader_is_freed_without_the_garbage_collector():
    """No reference cycle through the loader's parts: on XLA a loader kept alive until a
    collection would put its device tensors into the next graph cut (a new compilation)."""
    import gc
    import weakref

    loader = make_loader(torch.rand(64), batch_size=16, beta=1.0, mode="fixed", history=32)
    emitted_ids(loader, epochs=2)
    counts, ref = loader.counts, weakref.ref(loader)
    gc.disable()
    try:
        del loader
        assert ref() is None
    finally:
        gc.enable()
    assert counts.num_source_batches == 8  # the counts stay readable, the engine's count too
    assert counts.num_nonfinite_losses == 0
