"""Exact resume at any batch of any epoch: the remaining batches, the scores and the draws
are those of the uninterrupted run; the checkpoint loads with weights_only=True. Every
rank's states are resumed only when they were taken at one step."""

import copy
import functools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.shared.checkpoints import CHECKSUM
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch import thread_runs
from tests.neuron_sift.epoch.helpers import IdDataset, Prefetcher, ids_of, oracle_loss
from tests.neuron_sift.epoch.thread_runs import Stop, joined
from tests.neuron_sift.shared.thread_dist import build_on_ranks

EPOCHS = 6
CFGS = [
    {"seed": 5},
    {"seed": 5, "policy": "below_mean", "kept_share": 0.5},
    {"seed": 5, "noise_guard_epochs": 1, "noise_guard_quantile": 0.8},
]


def new_loader(cfg, workers=0):
    ds = IdDataset(203)
    kw = {"num_workers": workers, "persistent_workers": workers > 0} if workers else {}
    return EpochSiftingDataloader(cfg, DataLoader(ds, batch_size=16, shuffle=True, **kw), num_epochs=EPOCHS)


def train(loader, epochs, stop_after=None, wrap=None):
    """Oracle-loss loop; returns (ids per batch, stopped) and stops after ``stop_after`` batches."""
    seen = []
    for _ in range(epochs):
        source = wrap(loader) if wrap else loader
        for x, _y in source:
            seen.append(ids_of(x))
            loader.weighted_loss(oracle_loss(x))
            if stop_after is not None and len(seen) == stop_after:
                return seen, True
    return seen, False


@pytest.mark.parametrize("cfg", CFGS, ids=["percentile", "below_mean-budget", "guard"])
@pytest.mark.parametrize("stop", [1, 13, 14, 22, 30])
def test_resume_at_any_batch_replays_the_uninterrupted_run(cfg, stop):
    full, _ = train(new_loader(cfg), EPOCHS)
    reference = new_loader(cfg)
    train(reference, EPOCHS)
    a = new_loader(cfg)
    first, stopped = train(a, EPOCHS, stop_after=stop)
    assert stopped
    state = roundtrip(a.state_dict())
    epoch_of_stop = a.epoch
    b = new_loader(cfg)
    b.load_state_dict(state)
    rest = []
    in_progress = state["in_progress"]
    if in_progress:
        for x, _y in b:  # the rest of the interrupted epoch
            rest.append(ids_of(x))
            b.weighted_loss(oracle_loss(x))
    more, _ = train(b, EPOCHS - epoch_of_stop)
    assert first + rest + more == full
    assert torch.equal(b.tables.snapshot().isnan(), reference.tables.snapshot().isnan())
    assert torch.allclose(b.tables.snapshot().nan_to_num(), reference.tables.snapshot().nan_to_num())
    assert [h["kept"] for h in b.history] == [h["kept"] for h in reference.history]


def test_resume_with_batches_prefetched_but_not_trained():
    """Batches a prefetching wrapper pulled but the loop never trained are yielded again."""
    cfg = {"seed": 2}
    full, _ = train(new_loader(cfg), 3)
    a = new_loader(cfg)
    first, _ = train(a, 3, stop_after=20, wrap=lambda l: Prefetcher(l, depth=4))
    state = roundtrip(a.state_dict())
    b = new_loader(cfg)
    b.load_state_dict(state)
    rest = []
    for x, _y in b:
        rest.append(ids_of(x))
        b.weighted_loss(oracle_loss(x))
    more, _ = train(b, 3 - b.epoch)
    assert first + rest + more == full


def test_resume_with_workers():
    cfg = {"seed": 4, "kept_share": 0.3}
    full, _ = train(new_loader(cfg, workers=2), 3)
    a = new_loader(cfg, workers=2)
    first, _ = train(a, 3, stop_after=16)
    b = new_loader(cfg, workers=2)
    b.load_state_dict(roundtrip(a.state_dict()))
    rest = []
    for x, _y in b:  # the rest of the interrupted epoch
        rest.append(ids_of(x))
        b.weighted_loss(oracle_loss(x))
    more, _ = train(b, 3 - b.epoch)
    assert first + rest + more == full


def test_a_state_of_another_setup_is_refused():
    a = new_loader({"seed": 1})
    train(a, 1)
    state = a.state_dict()
    with pytest.raises(ValueError, match="policy"):
        new_loader({"seed": 1, "policy": "below_mean"}).load_state_dict(state)
    other = EpochSiftingDataloader({}, DataLoader(IdDataset(50), batch_size=16))
    with pytest.raises(ValueError, match="n="):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="not an EpochSiftingDataloader state"):
        a.load_state_dict({"version": 1})


def test_an_iterator_started_before_loading_is_void():
    a = new_loader({"seed": 1})
    it = iter(a)
    next(it)
    a.load_state_dict(roundtrip(new_loader({"seed": 1}).state_dict()))
    with pytest.raises(RuntimeError, match="no longer valid"):
        next(it)


# -- every rank's states, taken at one step (load_state_dict_from_ranks) ----------------------
# Ranks are threads (``thread_runs``): 96 samples, batches of 4, a budget of half, so each of
# two ranks trains 6 batches of 24 samples in the first sifted epoch (epoch 1).

TABLES = ["replicated", "sharded"]
SIFTED = 48  # the first sifted epoch's samples over all ranks


@functools.cache
def stopped(table, batches):
    """Two ranks stopped after ``batches`` batches of epoch 1 (their states in ``.states``)."""
    with pytest.MonkeyPatch.context() as mp:
        return thread_runs.train(mp, 2, {"score_table": table}, stop=Stop(1, batches))


@functools.cache
def resumed_at_three(table, batches):
    """Two ranks stopped after 2 batches of epoch 1, resumed on three, which stop after
    ``batches`` batches of the epoch's rest (their plan holds the ids done before)."""
    with pytest.MonkeyPatch.context() as mp:
        return thread_runs.train(mp, 3, {"score_table": table}, states=stopped(table, 2).states, stop=Stop(1, batches))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_states_taken_at_different_steps_are_refused_naming_each_ranks_step(monkeypatch, table, world):
    """Rank 0's state after 5 batches of the epoch, rank 1's after 2: resumed, the epoch would
    train rank 1's 3 batches between them twice. Refused at the run's own world size (each
    rank's own state) and at any other."""
    states = [stopped(table, 5).states[0], stopped(table, 2).states[1]]
    with pytest.raises(
        ValueError,
        match=r"the states were taken at different steps of epoch 1 \(0-based\): rank 0 at batch 5, rank 1 at "
        r"batch 2 \(batches whose losses were recorded or skipped\)\. In lockstep training every rank is at the "
        r"same batch",
    ):
        thread_runs.train(monkeypatch, world, {"score_table": table}, states=states)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_states_taken_at_one_step_resume_the_epoch_with_each_sample_once(monkeypatch, table, world):
    before = stopped(table, 5)
    after = thread_runs.train(monkeypatch, world, {"score_table": table}, states=before.states)
    ids, _ = joined([before, after], 1)
    assert sorted(ids) == sorted(set(ids)) and len(ids) == SIFTED


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("world", [2, 3])
def test_states_of_a_resumed_plan_at_different_steps_are_refused(monkeypatch, table, world):
    """After a resume at another world size the positions count the batches of the epoch's
    rest, the same on every rank in lockstep: states at different steps of it are refused."""
    one, two = resumed_at_three(table, 1).states, resumed_at_three(table, 2).states
    with pytest.raises(ValueError, match=r"rank 0 at batch 2, rank 1 at batch 1, rank 2 at batch 1 \("):
        thread_runs.train(monkeypatch, world, {"score_table": table}, states=[two[0], one[1], one[2]])
    resumed = thread_runs.train(monkeypatch, world, {"score_table": table}, states=one)  # one step: they load
    ids, _ = joined([stopped(table, 2), resumed_at_three(table, 1), resumed], 1)
    assert sorted(ids) == sorted(set(ids)) and len(ids) == SIFTED


def one_rank(table):
    """A loader of ``thread_runs``' setup in this process alone (world size 1)."""
    dl = DataLoader(IdDataset(thread_runs.N), batch_size=thread_runs.BATCH, shuffle=True)
    cfg = {**thread_runs.CONFIG, "score_table": table}
    return EpochSiftingDataloader(cfg, dl, num_epochs=thread_runs.EPOCHS, distributed=False)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("rank", [0, 1])
def test_each_ranks_state_of_two_ranks_at_world_size_one_points_to_load_state_dict_from_ranks(table, rank):
    with pytest.raises(
        ValueError,
        match=rf"checkpoint has world_size=2, rank={rank} but this loader has world_size=1, rank=0: "
        r"load_state_dict\(\) loads each rank's own state .*pass every rank's state_dict\(\) of the run to "
        r"load_state_dict_from_ranks\(states\)",
    ):
        one_rank(table).load_state_dict(stopped(table, 5).states[rank])
    one_rank(table).load_state_dict_from_ranks(stopped(table, 5).states)  # as it says: that loads


def test_a_sharded_ranks_plan_holding_another_ranks_sample_is_refused_naming_the_rank():
    states = [copy.deepcopy(s) for s in stopped("sharded", 5).states]
    other = int(states[1]["progress"]["plan"]["order"][0])  # owned by rank 1
    states[0]["progress"]["plan"]["order"][0] = other
    del states[0][CHECKSUM]  # as in a state of a version that wrote none: its fields are checked
    with pytest.raises(
        ValueError,
        match=rf"rank 0's state \(of 2\): invalid checkpoint: progress\.plan\.order holds sample id {other}, owned by "
        r"rank 1, not by this rank \(0 of 2\)",
    ):
        one_rank("sharded").load_state_dict_from_ranks(states)


@pytest.mark.parametrize("table", TABLES)
def test_a_bad_field_in_another_ranks_state_is_refused_naming_that_rank(table):
    states = [copy.deepcopy(s) for s in stopped(table, 5).states]
    states[1]["progress"]["position"] = 999
    del states[1][CHECKSUM]
    loader = one_rank(table)
    with pytest.raises(ValueError, match=r"rank 1's state \(of 2\): invalid checkpoint: progress\.position .*got 999"):
        loader.load_state_dict_from_ranks(states)
    states[1]["progress"]["position"] = 5  # as it was: then they load
    loader.load_state_dict_from_ranks(states)


@pytest.mark.parametrize("table", TABLES)
def test_states_of_one_step_holding_different_plans_are_refused(table):
    """Every rank of a resumed epoch holds the same plan (its epoch, kind, and ids done before
    the resume): a state whose plan says otherwise is of another run or resume, refused."""
    states = [copy.deepcopy(s) for s in resumed_at_three(table, 1).states]
    states[1]["progress"]["plan"]["kind"] = "anneal"
    del states[1][CHECKSUM]
    with pytest.raises(ValueError, match=r"the states hold different plans \(rank 0's and rank 1's\)"):
        one_rank(table).load_state_dict_from_ranks(states)


# -- the edges a deliberate break of 0.8.0 went past (issue 39) -------------------------------


@pytest.mark.parametrize("table", TABLES)
def test_every_ranks_states_are_verified_by_their_checksums_at_another_world_size(table):
    """``load_state_dict_from_ranks`` verifies every state it reads, as ``load_state_dict`` does:
    another rank's state changed after it was written is refused, not merged."""
    states = [copy.deepcopy(s) for s in stopped(table, 5).states]
    states[1]["tables"]["nonfinite"] = 3  # the checksum kept: the content no longer matches it
    with pytest.raises(ValueError, match="the state's content does not match its checksum"):
        one_rank(table).load_state_dict_from_ranks(states)


def test_a_replicated_plan_whose_order_differs_between_ranks_is_refused():
    """Every rank of a replicated table holds the whole plan: the same ids in the same order."""
    states = [copy.deepcopy(s) for s in stopped("replicated", 5).states]
    order = states[1]["progress"]["plan"]["order"]
    order[[0, 1]] = order[[1, 0]]  # the same ids, another order
    del states[1][CHECKSUM]
    with pytest.raises(ValueError, match=r"the states hold different plans \(rank 0's and rank 1's\)"):
        one_rank("replicated").load_state_dict_from_ranks(states)


@pytest.mark.parametrize("table", TABLES)
def test_states_in_any_order_resume_as_in_rank_order(monkeypatch, table):
    """The states say their ranks: given out of rank order they resume exactly as in order, at
    another world size and at their own (each rank its own state)."""
    states = stopped(table, 5).states
    in_order, reversed_order = one_rank(table), one_rank(table)
    in_order.load_state_dict_from_ranks([roundtrip(s) for s in states])
    reversed_order.load_state_dict_from_ranks([roundtrip(s) for s in reversed(states)])
    assert reversed_order.state_dict()[CHECKSUM] == in_order.state_dict()[CHECKSUM]

    def own(rank):
        dl = DataLoader(IdDataset(thread_runs.N), batch_size=thread_runs.BATCH, shuffle=True)
        two = EpochSiftingDataloader({**thread_runs.CONFIG, "score_table": table}, dl, num_epochs=thread_runs.EPOCHS)
        two.load_state_dict_from_ranks([roundtrip(s) for s in reversed(states)])
        return two.state_dict()[CHECKSUM]

    assert build_on_ranks(monkeypatch, 2, own) == [s[CHECKSUM] for s in states]


@pytest.mark.parametrize("table", TABLES)
def test_a_middle_ranks_position_that_differs_is_refused(table):
    """Every rank's position is compared, not only the first's and the last's."""
    states = [copy.deepcopy(s) for s in resumed_at_three(table, 1).states]
    states[1]["progress"]["position"] = 2
    del states[1][CHECKSUM]
    with pytest.raises(ValueError, match=r"rank 0 at batch 1, rank 1 at batch 2, rank 2 at batch 1 \("):
        one_rank(table).load_state_dict_from_ranks(states)


def test_a_guests_unscored_entry_never_overwrites_its_owners_score():
    """Three ranks resumed a sharded run and host guests; one guest's entry is unscored (NaN):
    resumed again on one rank, the sample keeps its owner's score."""
    states = [copy.deepcopy(s) for s in resumed_at_three("sharded", 1).states]
    planner = one_rank("sharded").planner.as_rank(3, 0)
    plan = EpochPlan.from_state(states[0]["progress"]["plan"])
    guests = planner.guests_of(plan)
    assert guests.size  # rank 0 hosts samples of other ranks
    guest = int(np.unique(guests)[0])
    states[0]["tables"]["scores"][planner.owner.owned] = float("nan")  # the first guest's slot
    del states[0][CHECKSUM]
    loader = one_rank("sharded")
    loader.load_state_dict_from_ranks(states)
    score = loader.tables.snapshot()[loader.planner.slots(np.array([guest]))]
    assert not torch.isnan(score).any()  # the owner's score (every sample was scored in the warm-up)
