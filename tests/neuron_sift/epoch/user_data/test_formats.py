"""The epoch mode over large-dataset formats: a Hugging Face ``datasets`` Arrow dataset on
local disk, an ``IterableDataset`` that also reads by index (MosaicML Streaming's kind, on
every leg; ``test_mds.py`` runs Streaming itself where a leg installs it), and the refusal
of a pure stream. What users rely on: a sifted epoch reads only the samples its plan keeps,
each once, so the saving is real I/O and not just skipped compute."""

import datasets  # the test extra's; a missing package fails collection, it is never skipped
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset

from neuron_sift import EpochSiftingDataloader
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.format_sources import (
    WIDTH,
    CountingReads,
    ShardedRecords,
    SizedStream,
    Stream,
    arrow_dataset,
    write_shards,
)
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START

N, BATCH = 96, 8
CONFIG = {**PRUNE_FROM_THE_START, "seed": 5, "kept_share": 0.5, "warmup_epochs": 1}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """No network: the Hub is off for ``datasets`` whether or not it was imported before."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)


def train_epoch(loader, model, opt):
    """One epoch of a tiny classifier; the ids trained, in training order."""
    trained = []
    for batch in loader:
        trained += batch["id"].tolist()
        per_sample = F.cross_entropy(model(batch["x"].float()), batch["y"].long(), reduction="none")
        loss = loader.weighted_loss(per_sample)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return trained


def run_counting(loader, reads: list, epochs: int):
    """``epochs`` epochs; per epoch the plan's ids, the ids trained and the ids read."""
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    out = []
    for _ in range(epochs):
        reads.clear()
        plan = loader.start_epoch()
        trained = train_epoch(loader, model, opt)
        out.append((plan, trained, list(reads)))
    return out


def assert_reads_only_the_plan(epochs, n=N):
    kinds = []
    for plan, trained, reads in epochs:
        order = plan.order.tolist()
        assert trained == order  # the planned samples, in the planned order
        assert len(reads) == len(set(reads))  # each read once
        assert sorted(reads) == sorted(order)  # every planned id read, no skipped id read
        kinds.append(plan.kind)
    assert kinds[0] == "warmup" and len(epochs[0][2]) == n
    sifted = [e for e in epochs if e[0].kind == "sift"]
    assert sifted and all(len(reads) == n // 2 for _, _, reads in sifted)  # kept_share 0.5 of the reads


# -- Hugging Face datasets (Arrow, map-style) --------------------------------------------


def test_a_sifted_epoch_reads_only_its_planned_rows_of_an_arrow_dataset(tmp_path):
    hf = arrow_dataset(str(tmp_path / "arrow"), N)
    hf.set_format("torch")
    counted = CountingReads(hf)
    loader = EpochSiftingDataloader(CONFIG, DataLoader(counted, batch_size=BATCH, shuffle=True), num_epochs=4)
    epochs = run_counting(loader, counted.reads, 3)
    assert_reads_only_the_plan(epochs)
    batches = sum(-(-len(trained) // BATCH) for _, trained, _ in epochs)
    assert counted.batched_calls == batches  # Arrow's batched read, one per batch: none went around the counter


def test_an_arrow_dataset_with_a_collate_function_and_workers_trains_the_plan(tmp_path):
    hf = arrow_dataset(str(tmp_path / "arrow"), N)  # no format: rows are dicts of Python values

    def collate(rows):
        return {k: torch.tensor([r[k] for r in rows]) for k in ("id", "x", "y")}

    source = DataLoader(hf, batch_size=BATCH, shuffle=True, collate_fn=collate, num_workers=2)
    loader = EpochSiftingDataloader(CONFIG, source, num_epochs=4)
    assert loader.orig_dataloader.dataset is hf
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for _ in range(3):
        plan = loader.start_epoch()
        assert train_epoch(loader, model, opt) == plan.order.tolist()
    assert [h["kind"] for h in loader.history] == ["warmup", "sift", "sift"]
    assert loader.metrics()["unpaired_batches"] == 0


# -- an IterableDataset that also reads by index (MosaicML Streaming's kind) ------------


def test_a_random_access_iterable_dataset_is_read_by_index_only_for_planned_samples(tmp_path):
    ds = ShardedRecords(write_shards(str(tmp_path / "shards"), N))
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=4)
    epochs = run_counting(loader, ds.reads, 3)
    assert_reads_only_the_plan(epochs)
    assert any(e[0].order.tolist() != sorted(e[0].order.tolist()) for e in epochs)  # shuffle=True: planned order
    # The user's object is untouched: still a stream of every sample, in order.
    assert loader.orig_dataloader.dataset is ds and isinstance(ds, IterableDataset)
    ds.reads.clear()
    assert [int(s["id"]) for s in ds] == list(range(N))


def test_a_random_access_stream_without_shuffle_trains_in_dataset_order(tmp_path):
    ds = ShardedRecords(write_shards(str(tmp_path / "shards"), N), shuffle=False)
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=4)
    epochs = run_counting(loader, ds.reads, 2)
    assert_reads_only_the_plan(epochs)
    for _, trained, _ in epochs:
        assert trained == sorted(trained)


def test_the_index_space_is_every_sample_not_one_ranks_length(tmp_path):
    """Streaming's ``__len__`` under 4 ranks is a quarter of the samples; plans cover all of them."""
    ds = ShardedRecords(write_shards(str(tmp_path / "shards"), N), world_size=4)
    assert len(ds) == N // 4
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=2)
    assert loader.n == N
    epochs = run_counting(loader, ds.reads, 1)
    assert sorted(epochs[0][2]) == list(range(N))


def test_a_random_access_stream_with_workers_and_a_resume_reads_only_the_rest(tmp_path):
    root = write_shards(str(tmp_path / "shards"), N)
    ds = ShardedRecords(root)
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH, num_workers=2), num_epochs=4)
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    assert train_epoch(loader, model, opt) == loader.plan.order.tolist()  # warm-up, in worker processes
    plan = loader.start_epoch()
    first = []
    for batch in loader:
        first += batch["id"].tolist()
        loader.weighted_loss(batch["x"][:, 0].abs() + 0.1)
        if len(first) == 3 * BATCH:
            break
    state = roundtrip(loader.state_dict())  # preempted here; a new process opens the shards again
    again = ShardedRecords(root)
    resumed = EpochSiftingDataloader(CONFIG, DataLoader(again, batch_size=BATCH), num_epochs=4)
    resumed.load_state_dict(state)
    rest = train_epoch(resumed, model, opt)
    assert first + rest == plan.order.tolist()  # nothing trained twice, nothing lost
    assert sorted(again.reads) == sorted(rest)  # the resumed process read only the rest of the plan


def test_a_resampled_epoch_is_refused(tmp_path):
    ds = ShardedRecords(write_shards(str(tmp_path / "shards"), N), epoch_size=2 * N)
    with pytest.raises(ValueError, match="resamples an epoch of 192 samples from its 96"):
        EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=2)


# -- pure streams --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["torch", "sized", "hf"])
def test_a_pure_stream_is_refused_saying_why_and_what_to_use(kind, tmp_path):
    if kind == "torch":
        stream = Stream(N)
    elif kind == "sized":
        stream = SizedStream(N)
    else:  # Hugging Face's IterableDataset: __getitem__ takes a column name, and there is no length
        stream = arrow_dataset(str(tmp_path / "arrow"), N).to_iterable_dataset()
    with pytest.raises(TypeError) as err:
        EpochSiftingDataloader(CONFIG, DataLoader(stream, batch_size=BATCH), num_epochs=2)
    message = str(err.value)
    assert f"IterableDataset ({type(stream).__name__}) without random access" in message
    assert "a skipped sample would still be read" in message  # why
    for instead in ("map-style dataset", "datasets.Dataset", "StreamingDataset", "SiftingDataloader"):
        assert instead in message  # what to use
