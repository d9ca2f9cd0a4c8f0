"""The state a resume at another world size builds (``run_states.resumed_state``), whichever
score table made it into this rank's. What users rely on: it is a loader state like any
other (the layout, version and checksum ``state_dict()`` writes), so a fresh loader loads
it and trains the rest of the epoch in progress from its start, nothing trained twice or
left out; the history is the run's; and the counts of every old rank are kept, summed on
rank 0 and zero elsewhere, so ``metrics()`` summed over the ranks is the run's. (Whether
every rank's states are one run's at one step: ``test_resume.py``, ``planning/test_dealing.py``.)"""

import copy
from dataclasses import replace

import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.resuming.run_states import read_run, resumed_state
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle_loss

N, BATCH = 24, 4


def new_loader():
    dl = DataLoader(IdDataset(N), batch_size=BATCH, shuffle=True)
    return EpochSiftingDataloader({**PRUNE_FROM_THE_START, "seed": 3, "kept_share": 0.5}, dl, num_epochs=4)


def stopped():
    """A loader stopped after 2 batches of its first sifted epoch, and the ids it trained there."""
    loader = new_loader()
    for x, _y in loader:  # the warm-up
        loader.weighted_loss(oracle_loss(x))
    trained = []
    for x, _y in loader:
        trained += ids_of(x)
        loader.weighted_loss(oracle_loss(x))
        if len(trained) == 2 * BATCH:
            break
    return loader, trained


def parts_of(old):
    return old["tables"]["scores"], old["shares"], old["guard"], old["start"]


def test_a_resumed_state_loads_into_a_fresh_loader_which_trains_the_rest_of_the_epoch():
    loader, trained = stopped()
    read = read_run([roundtrip(loader.state_dict())])
    fresh = new_loader()
    plan = EpochPlan.from_state(read[0]["progress"]["plan"])
    plan_state = replace(plan, world_size=1, done=torch.tensor(trained)).state_dict()
    state = resumed_state(read, fresh.planner, plan_state, *parts_of(read[0]))
    assert state.keys() == loader.state_dict().keys()  # the loader's own layout, checksum included
    fresh.load_state_dict(roundtrip(state))
    assert fresh.resuming and fresh.epoch == loader.epoch and fresh.counts == loader.counts
    assert list(fresh.history) == list(loader.history)
    rest = []
    for x, _y in fresh:
        rest += ids_of(x)
        fresh.weighted_loss(oracle_loss(x))
    assert trained + rest == loader.plan.order.tolist()  # the rest from its start, each sample once


def test_the_counts_of_every_old_rank_are_summed_on_rank_0_and_zero_on_the_others():
    loader, _ = stopped()
    (first,) = read_run([loader.state_dict()])
    second = copy.deepcopy(first)  # stands in for another old rank's counts
    second["pairing"] = {key: 1 for key in first["pairing"]}
    second["tables"]["nonfinite"] = 2
    planner = new_loader().planner
    states = [resumed_state([first, second], planner.as_rank(2, r), None, *parts_of(first)) for r in (0, 1)]
    assert [s["planner"]["world_size"] for s in states] == [2, 2] and [s["planner"]["rank"] for s in states] == [0, 1]
    assert states[0]["pairing"] == {key: value + 1 for key, value in first["pairing"].items()}
    assert states[0]["tables"]["nonfinite"] == first["tables"]["nonfinite"] + 2
    assert set(states[1]["pairing"].values()) == {0} and states[1]["tables"]["nonfinite"] == 0
    assert all(s["progress"]["position"] == 0 and s["history"] == first["history"] for s in states)
