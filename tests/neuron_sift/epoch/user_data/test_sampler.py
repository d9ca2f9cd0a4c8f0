"""The user's sampler survives the epoch plan: its support is never widened (a
train/validation split by SubsetRandomSampler trains on the training part only, in every
kind of epoch), shuffle=False trains in dataset order, custom samplers are read without
touching the run's random state, and samplers a plan cannot honour are refused saying what
to use instead."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from neuron_sift import EpochSiftingDataloader
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle_loss

N, B, EPOCHS = 100, 8, 5  # warm-up, 3 sifted epochs, 1 annealing epoch (anneal_fraction 0.2)
TRAIN = sorted(np.random.default_rng(0).permutation(N)[:60].tolist())  # a train split, not contiguous
CFG = {**PRUNE_FROM_THE_START, "seed": 4, "anneal_fraction": 0.2}


class SubsetSampler(Sampler[int]):
    """A custom sampler over a subset, drawing its order from the global torch, NumPy and
    Python random states (the worst case for reading it without changing the run)."""

    def __init__(self, indices):
        self.indices = list(indices)

    def __iter__(self):
        order = torch.randperm(len(self.indices)).tolist()
        np.random.rand()
        random.random()
        return iter([self.indices[i] for i in order])

    def __len__(self):
        return len(self.indices)


class SeededSampler(SubsetSampler):
    """A custom sampler drawing its order from its own generator."""

    def __init__(self, indices):
        super().__init__(indices)
        self.generator = torch.Generator().manual_seed(5)

    def __iter__(self):
        return iter([self.indices[i] for i in torch.randperm(len(self.indices), generator=self.generator)])


class PairBatches(Sampler[list[int]]):
    """A custom batch sampler over a subset (no ``.sampler``): pairs of neighbours."""

    batch_size, drop_last = 2, False

    def __init__(self, indices):
        self.indices = list(indices)

    def __iter__(self):
        for i in range(0, len(self.indices), 2):
            yield self.indices[i : i + 2]

    def __len__(self):
        return (len(self.indices) + 1) // 2


class Endless(Sampler[int]):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield int(torch.randint(0, N, (1,), generator=g))


class IntBatches(Sampler[int]):
    """A would-be batch sampler that yields single indices."""

    batch_size, drop_last = 2, False

    def __iter__(self):
        return iter([0, 1])


class Floats(Sampler[float]):
    def __iter__(self):
        return iter([0.0, 1.0])


def source(kind, ds):
    """A DataLoader over ``ds`` sampling the training split ``TRAIN`` the way ``kind`` names."""
    if kind == "subset":
        return DataLoader(ds, batch_size=B, sampler=SubsetRandomSampler(TRAIN))
    if kind == "batch_sampler":
        return DataLoader(ds, batch_sampler=BatchSampler(SubsetRandomSampler(TRAIN), B, drop_last=False))
    if kind == "custom":
        return DataLoader(ds, batch_size=B, sampler=SubsetSampler(TRAIN))
    if kind == "custom_batches":
        return DataLoader(ds, batch_sampler=PairBatches(TRAIN))
    raise AssertionError(kind)


def run(loader, ds, epochs=EPOCHS):
    """Every epoch with oracle losses: (kind, trained ids in order, ids the dataset loaded)."""
    out = []
    for _ in range(epochs):
        ds.loaded.clear()
        trained = []
        for x, _y in loader:
            trained += ids_of(x)
            loader.weighted_loss(oracle_loss(x))
        out.append((loader.plan.kind, trained, list(ds.loaded)))
    return out


@pytest.mark.parametrize("kind", ["subset", "batch_sampler", "custom", "custom_batches"])
@pytest.mark.parametrize("share", [None, 0.5])
def test_no_sample_outside_the_samplers_support_is_ever_loaded(kind, share):
    ds = IdDataset(N)
    loader = EpochSiftingDataloader({**CFG, "kept_share": share}, source(kind, ds), num_epochs=EPOCHS)
    planned = loader.planned_steps()
    epochs = run(loader, ds)
    assert [k for k, _, _ in epochs] == ["warmup", "sift", "sift", "sift", "anneal"]
    train = set(TRAIN)
    for k, trained, loaded in epochs:
        assert set(loaded) <= train, sorted(set(loaded) - train)  # the validation part is never read
        assert sorted(loaded) == sorted(trained)
        if k != "sift":
            assert sorted(trained) == TRAIN  # a full epoch is the whole support, once
        elif share is not None:
            assert len(trained) == 30  # the budget is a share of the support, not of the dataset
    if share is not None:
        batch = 2 if kind == "custom_batches" else B
        assert planned == sum(-(-len(t) // batch) for _, t, _ in epochs)
        assert [h["observed_kept_share"] for h in loader.history] == [1.0, 0.5, 0.5, 0.5, 1.0]
    scores = loader.tables.snapshot()
    outside = torch.ones(N, dtype=torch.bool)
    outside[TRAIN] = False
    assert torch.isnan(scores[outside]).all() and not torch.isnan(scores[TRAIN]).any()
    plan = loader.plan
    assert float(plan.inclusion[outside].abs().sum()) == 0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda ds: DataLoader(ds, batch_size=B),  # shuffle=False
        lambda ds: DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), B, drop_last=False)),
        lambda ds: DataLoader(ds, batch_size=B, sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=False)),
    ],
    ids=["shuffle_false", "batch_sampler", "distributed_sampler"],
)
def test_a_sequential_sampler_trains_the_kept_samples_in_dataset_order(make):
    ds = IdDataset(N)
    loader = EpochSiftingDataloader({**CFG, "kept_share": 0.3}, make(ds), num_epochs=EPOCHS)
    for kind, trained, _ in run(loader, ds):
        assert trained == sorted(trained)
        assert len(trained) == (N if kind != "sift" else 30)


def test_a_shuffling_sampler_still_trains_in_a_new_random_order_each_epoch():
    ds = IdDataset(N)
    dl = DataLoader(ds, batch_size=B, sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True))
    epochs = run(EpochSiftingDataloader(CFG, dl, num_epochs=EPOCHS), ds)
    assert all(t != sorted(t) for _, t, _ in epochs)
    assert epochs[0][1] != epochs[-1][1] and sorted(epochs[0][1]) == list(range(N))


REFUSED = [
    pytest.param(
        lambda ds: dict(sampler=WeightedRandomSampler([1.0] * N, N)),
        TypeError,
        "WeightedRandomSampler.*Subset",
        id="weighted",
    ),
    pytest.param(
        lambda ds: dict(sampler=RandomSampler(ds, replacement=True)),
        ValueError,
        "replacement=True.*Subset",
        id="replacement",
    ),
    pytest.param(
        lambda ds: dict(sampler=RandomSampler(ds, num_samples=50)),
        ValueError,
        "num_samples=50.*Subset",
        id="fewer_samples",
    ),
    pytest.param(
        lambda ds: dict(sampler=SubsetRandomSampler([1, 2, 2])),
        ValueError,
        "index 2 more than once.*Subset",
        id="repeats",
    ),
    pytest.param(
        lambda ds: dict(sampler=SubsetRandomSampler([3, N])), ValueError, f"index {N}, outside", id="out_of_range"
    ),
    pytest.param(lambda ds: dict(sampler=SubsetRandomSampler([])), ValueError, "yields no samples", id="empty"),
    pytest.param(lambda ds: dict(sampler=Endless()), ValueError, "more than once", id="endless"),
    pytest.param(lambda ds: dict(sampler=Floats()), TypeError, "not a sample index", id="floats"),
    pytest.param(
        lambda ds: dict(sampler=DistributedSampler(ds, num_replicas=2, rank=0)),
        ValueError,
        "num_replicas=2.*1 rank",
        id="distributed_world",
    ),
    pytest.param(lambda ds: dict(batch_sampler=IntBatches()), TypeError, "yields 0, not a batch", id="int_batches"),
]


@pytest.mark.parametrize("kwargs, error, message", REFUSED)
def test_a_sampler_a_plan_cannot_honour_is_refused_saying_what_to_use(kwargs, error, message):
    ds = IdDataset(N)
    extra = kwargs(ds)
    dl = DataLoader(ds, **({"batch_size": B} if "sampler" in extra else {}), **extra)
    with pytest.raises(error, match=message):
        EpochSiftingDataloader(CFG, dl, num_epochs=EPOCHS)
    assert ds.loaded == []


def test_a_sharded_batch_sampler_must_shard_over_the_loaders_ranks():
    accelerate = pytest.importorskip("accelerate.data_loader")
    ds = IdDataset(N)
    inner = BatchSampler(RandomSampler(ds), B, drop_last=False)
    shard = accelerate.BatchSamplerShard(inner, num_processes=2, process_index=0)
    with pytest.raises(ValueError, match="over 2 processes"):
        EpochSiftingDataloader(CFG, DataLoader(ds, batch_sampler=shard), num_epochs=EPOCHS)
    one = accelerate.BatchSamplerShard(BatchSampler(SubsetRandomSampler(TRAIN), B, False), num_processes=1)
    loader = EpochSiftingDataloader(CFG, DataLoader(ds, batch_sampler=one), num_epochs=EPOCHS)
    assert loader.planner.m == len(TRAIN)


def test_reading_a_custom_sampler_leaves_every_random_state_as_it_was():
    ds = IdDataset(N)
    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    before = (torch.random.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    loader = EpochSiftingDataloader(CFG, DataLoader(ds, batch_size=B, sampler=SubsetSampler(TRAIN)), num_epochs=3)
    assert torch.equal(torch.random.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert random.getstate() == before[2]
    assert loader.planner.m == len(TRAIN) and not loader.planner.ordered
    own = SeededSampler(TRAIN)  # a sampler's own generator is restored too
    state = own.generator.get_state()
    EpochSiftingDataloader(CFG, DataLoader(ds, batch_size=B, sampler=own), num_epochs=3)
    assert torch.equal(own.generator.get_state(), state)


def test_a_sampler_over_every_sample_plans_as_the_default_one():
    """A SubsetRandomSampler or custom sampler of all samples is no restriction: the same
    plans as shuffle=True (so its checkpoints stay interchangeable with the default's)."""
    plans = []
    for sampler in (None, SubsetRandomSampler(range(N)), SubsetSampler(range(N)[::-1])):
        ds = IdDataset(N)
        dl = DataLoader(ds, batch_size=B, shuffle=sampler is None, sampler=sampler)
        loader = EpochSiftingDataloader(CFG, dl, num_epochs=EPOCHS)
        run(loader, ds, epochs=2)
        plans.append(loader.plan.order)
        assert "support_size" not in loader.state_dict()["planner"]
    assert torch.equal(plans[0], plans[1]) and torch.equal(plans[0], plans[2])


def subset_loader(indices, shuffle=False):
    ds = IdDataset(N)
    dl = DataLoader(ds, batch_size=B, shuffle=shuffle, sampler=None if shuffle else SubsetRandomSampler(indices))
    return ds, EpochSiftingDataloader({**CFG, "kept_share": 0.5}, dl, num_epochs=EPOCHS)


def test_a_checkpoint_taken_with_another_support_is_refused():
    ds, a = subset_loader(TRAIN)
    run(a, ds, epochs=2)
    state = roundtrip(a.state_dict())
    other = sorted(set(TRAIN) - {TRAIN[0]}) + [next(i for i in range(N) if i not in TRAIN)]
    for _, b in (subset_loader(other), subset_loader(TRAIN[1:]), subset_loader(None, shuffle=True)):
        with pytest.raises(ValueError, match="sampler"):
            b.load_state_dict(state)
        assert b.epoch == 0
    _, everything = subset_loader(None, shuffle=True)
    with pytest.raises(ValueError, match="sampler over 100 samples"):
        subset_loader(TRAIN)[1].load_state_dict(roundtrip(everything.state_dict()))
    ds_c, c = subset_loader(TRAIN)
    c.load_state_dict(state)
    rest = run(c, ds_c, epochs=3)
    assert all(set(loaded) <= set(TRAIN) for _, _, loaded in rest)
