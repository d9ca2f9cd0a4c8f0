"""``EpochSiftingDataloader`` with ``score_table="sharded"`` in one process: each epoch trains
exactly its plan, losses land in the right slots, a checkpoint resumes exactly (and is
refused by a loader with the other table), the noise guard works from the summary, and the
state holds nothing larger than the rank's share. (Several ranks: ``test_ranks_in_threads.py``
and ``resuming/test_guard_elastic.py`` as threads, ``resuming/test_elastic.py`` under torchrun.)"""

import math

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler, SubsetRandomSampler

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle, oracle_loss

N, BATCH, EPOCHS = 70, 8, 5


def make(table="sharded", n=N, sampler=None, **cfg):
    ds = IdDataset(n)
    dl = DataLoader(ds, batch_size=BATCH, sampler=sampler, shuffle=sampler is None)
    config = {**PRUNE_FROM_THE_START, "seed": 3, "kept_share": 0.4, "score_table": table, **cfg}
    return EpochSiftingDataloader(config, dl, num_epochs=EPOCHS)


def run(loader, stop_after=None):
    """Train to the end (or ``stop_after`` batches); the ids of each epoch, as trained."""
    seen: dict[int, list[int]] = {}
    steps = 0
    while loader.epoch < EPOCHS or loader.resuming:
        for x, _y in loader:
            seen.setdefault(loader.plan.epoch, []).extend(ids_of(x))
            loader.weighted_loss(oracle_loss(x))
            steps += 1
            if steps == stop_after:
                return seen
    return seen


def test_each_epoch_trains_its_plan_and_the_scores_land_in_their_slots():
    loader = make()
    seen = run(loader)
    kinds = [h["kind"] for h in loader.history]
    assert kinds == ["warmup", "sift", "sift", "sift", "sift"]
    for e, ids in seen.items():
        assert len(set(ids)) == len(ids) == loader.history[e]["kept"]
    assert [h["kept"] for h in loader.history] == [N, 28, 28, 28, 28]
    scores = loader.tables.snapshot()
    ids = torch.arange(N)
    assert torch.equal(scores[torch.from_numpy(loader.planner.slots(ids.numpy()))], oracle(ids))


def test_a_checkpoint_resumes_exactly():
    whole = run(make())
    first = make()
    before = run(first, stop_after=14)  # two batches into the first sifted epoch
    state = first.state_dict()
    assert state["planner"]["score_table"] == "sharded" and state["shares"] == {}
    second = make()
    second.load_state_dict(state)
    after = run(second)
    joined = {e: before.get(e, []) + after.get(e, []) for e in whole}
    assert joined == whole
    assert torch.equal(second.tables.snapshot(), make_and_run_scores())


def make_and_run_scores():
    loader = make()
    run(loader)
    return loader.tables.snapshot()


def test_a_state_of_the_other_table_is_refused_naming_it():
    sharded, replicated = make(), make("replicated")
    run(sharded, stop_after=3)
    run(replicated, stop_after=3)
    with pytest.raises(ValueError, match="score_table='sharded'"):
        make("replicated").load_state_dict(sharded.state_dict())
    with pytest.raises(ValueError, match="score_table='replicated'"):
        make().load_state_dict(replicated.state_dict())


def test_a_subset_sampler_is_honoured():
    subset = list(range(0, N, 2))
    loader = make(sampler=SubsetRandomSampler(subset))
    seen = run(loader)
    assert all(set(ids) <= set(subset) for ids in seen.values())
    assert loader.planner.table_size == len(subset)


def test_the_noise_guard_leaves_out_persistently_hard_samples():
    """Every sample trains in the warm-up with its fixed loss; those above the 0.8 quantile
    of all scores (the lower quantile, as the merged summary reads it: exact here)
    start a streak of 1 and every sifted epoch leaves exactly them out; they keep their
    streak (not trained, not reset), the others never reach one."""
    loader = make(noise_guard_epochs=1, noise_guard_quantile=0.8)
    seen = run(loader)
    scores = oracle(torch.arange(N))
    threshold = torch.sort(scores).values[math.ceil(0.8 * N) - 1]
    high = {i for i in range(N) if scores[i] > threshold}
    assert len(high) == N - math.ceil(0.8 * N)  # distinct scores: a fifth of them
    assert [h["excluded"] for h in loader.history] == [0] + [len(high)] * (EPOCHS - 1)
    assert all(not high & set(seen[e]) for e in range(1, EPOCHS))
    assert len(seen[1]) == loader.history[1]["kept"] == round(0.4 * N)  # the budget from the rest
    streak = loader.guard.streak
    assert streak.shape[0] == loader.planner.table_size
    slots = torch.from_numpy(loader.planner.slots(torch.arange(N).numpy()))
    assert streak[slots].tolist() == [1 if i in high else 0 for i in range(N)]


def test_the_state_holds_one_entry_per_owned_sample_at_most():
    loader = make()
    run(loader, stop_after=12)
    state = loader.state_dict()
    tensors = [
        state["tables"]["scores"],
        state["guard"]["streak"],
        *(v for v in state["progress"]["plan"].values() if isinstance(v, torch.Tensor)),
    ]
    assert all(t.numel() <= loader.planner.table_size for t in tensors)
    assert "inclusion" not in state["progress"]["plan"]
    assert state["guard"]["streak"].numel() == 0  # the guard is off: no streaks held


def test_a_sequential_sampler_keeps_dataset_order_and_drop_last_trains_full_batches():
    ds = IdDataset(N)
    dl = DataLoader(ds, batch_size=BATCH, sampler=SequentialSampler(ds), drop_last=True)
    loader = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 3, "kept_share": 0.5, "score_table": "sharded"}, dl, num_epochs=EPOCHS
    )
    sizes = []
    for _ in range(EPOCHS):
        ids = []
        for x, _y in loader:
            ids += ids_of(x)
            sizes.append(x.shape[0])
            loader.weighted_loss(oracle_loss(x))
        assert ids == sorted(ids)
        assert loader.history[-1]["kept"] == len(ids) == (loader.plan.kept // BATCH) * BATCH
    assert set(sizes) == {BATCH}


def test_a_checkpoint_after_an_epochs_last_batch_then_a_peek_resumes_exactly():
    """The state taken after the warm-up's last loss (the loop has not asked for the next
    batch: an open epoch with an empty rest), then a peek at the next epoch before the loop
    goes on: the run is the uninterrupted one."""
    whole = run(make())
    first = make()
    before = run(first, stop_after=-(-N // BATCH))  # the warm-up's last batch
    second = make()
    second.load_state_dict(first.state_dict())
    assert len(second) == 0 and second.resuming
    assert next(iter(second), None) is None  # the empty rest: the loop's next iteration ends at once
    next(iter(second))  # a peek at the next epoch: nothing is spent
    after = run(second)
    assert {e: before.get(e, []) + after.get(e, []) for e in whole} == whole
    assert torch.equal(second.tables.snapshot(), make_and_run_scores())
