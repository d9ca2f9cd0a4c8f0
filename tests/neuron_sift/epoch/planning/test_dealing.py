"""Dealing the rest of a resumed epoch to ranks (``neuron_sift.epoch.planning.dealing``), and the
single-process side of resuming from every rank's states (``load_state_dict_from_ranks``);
the multi-rank resumes run under torchrun in resuming/test_elastic.py."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, SubsetRandomSampler

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.planning.dealing import deal_rest
from neuron_sift.shared.checkpoints import CHECKSUM, content_checksum
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle_loss


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(1, 300), st.integers(1, 8), st.integers(2, 32))
def test_every_rank_gets_the_same_number_of_batches_and_every_id_once(left, world, batch):
    if left < world:
        with pytest.raises(ValueError, match=f"{left} samples left, fewer than the {world} ranks"):
            deal_rest(np.arange(left), world, 0, batch)
        return
    dealt = [deal_rest(np.arange(left) * 3, world, r, batch) for r in range(world)]
    assert len({len(d) for d in dealt}) == 1  # lockstep
    ids = np.concatenate([b for d in dealt for b in d])
    assert sorted(ids.tolist()) == [3 * i for i in range(left)]  # each once, none lost
    assert all(0 < len(b) <= batch for d in dealt for b in d)


def test_a_share_one_short_of_another_batch_splits_its_last_batch():
    dealt = [deal_rest(np.arange(9), 2, r, 4) for r in range(2)]  # shares of 5 and 4
    assert [[len(b) for b in d] for d in dealt] == [[4, 1], [2, 2]]


def test_batches_of_one_with_unequal_shares_are_refused():
    with pytest.raises(ValueError, match="batches of one sample cannot be split"):
        deal_rest(np.arange(5), 2, 0, 1)
    assert [len(deal_rest(np.arange(6), 2, r, 1)) for r in range(2)] == [3, 3]
    assert deal_rest(np.arange(0), 3, 1, 4) == []


SPLIT = list(range(0, 40, 2))  # a training split: the even ids


def make_loader(kind="shuffle", n=40):
    """``shuffle``: every sample; ``subset``: a SubsetRandomSampler over ``SPLIT``;
    ``drop_last``: without the short last batch (each of two ranks' shares of the budget's
    20 loses 2, one process's none: the layout decides what is trained)."""
    if kind == "subset":
        dl = DataLoader(IdDataset(n), batch_size=4, sampler=SubsetRandomSampler(SPLIT))
    else:
        dl = DataLoader(IdDataset(n), batch_size=4, shuffle=True, drop_last=kind == "drop_last")
    return EpochSiftingDataloader({**PRUNE_FROM_THE_START, "seed": 3, "kept_share": 0.5}, dl, num_epochs=4)


def state_in_a_sifted_epoch(kind="shuffle", epoch=1):
    """A loader's state two batches into sifted epoch ``epoch`` (the first by default)."""
    loader = make_loader(kind)
    for e in range(epoch + 1):
        for n, (x, _y) in enumerate(loader):
            loader.weighted_loss(oracle_loss(x))
            if e == epoch and n == 1:
                break
    return loader.state_dict()


def train_epochs(loader, epochs):
    """``epochs`` iterations of ``loader``: per epoch, each batch's ids and weighted loss."""
    out = []
    for _ in range(epochs):
        out.append([(ids_of(x), float(loader.weighted_loss(oracle_loss(x)))) for x, _y in loader])
    return out


def test_the_states_of_one_process_at_its_own_world_size_resume_exactly():
    """One process's state, handed over as "every rank's" at world size 1, resumes as the
    uninterrupted run goes on: the same batches, with the same weights (the weighted losses,
    one computation on one device), to the end of the run."""
    uninterrupted = make_loader()
    whole = train_epochs(uninterrupted, 4)
    resumed = make_loader()
    resumed.load_state_dict_from_ranks([state_in_a_sifted_epoch()])  # two batches into epoch 1
    rest = train_epochs(resumed, 3)  # the rest of epoch 1, then epochs 2 and 3
    assert rest == [whole[1][2:], whole[2], whole[3]]
    assert resumed.counts == uninterrupted.counts  # the losses and batches recorded before the resume count too


def test_states_that_are_not_every_rank_of_one_run_are_refused():
    loader = make_loader()
    for x, _y in loader:
        loader.weighted_loss(oracle_loss(x))
    state = loader.state_dict()
    with pytest.raises(ValueError, match=r"every rank of the run, each once: got ranks \[0, 0\]"):
        make_loader().load_state_dict_from_ranks([state, state])
    with pytest.raises(ValueError, match="got none"):
        make_loader().load_state_dict_from_ranks([])
    two = as_two_ranks(state_in_a_sifted_epoch(), position=1)  # two ranks of one run at one step
    other_seed = sealed({**two[1], "planner": {**two[1]["planner"], "seed": 99}})
    with pytest.raises(ValueError, match="different runs: seed differs"):
        make_loader().load_state_dict_from_ranks([two[0], other_seed])
    later = as_two_ranks(state_in_a_sifted_epoch(epoch=2), position=1)[1]  # rank 1 one epoch on
    with pytest.raises(ValueError, match="different epochs"):
        make_loader().load_state_dict_from_ranks([two[0], later])


def sealed(state):
    """A state built by a test, with the checksum ``state_dict()`` would have written for it
    (a state edited after it was written is refused as damaged)."""
    return {**state, CHECKSUM: content_checksum(state)}


def as_two_ranks(state, position, in_progress=True):
    """One process's state as the states of two ranks at one step: every rank holds the same
    plan and trained its own share (rank r: order[r::2]) up to ``position`` batches."""
    plan = state["progress"]["plan"]
    two = []
    for r in range(2):
        mine = torch.zeros(40, dtype=torch.bool)
        mine[plan["order"][r::2]] = True
        two.append(
            sealed(
                {
                    **state,
                    "in_progress": in_progress,
                    "planner": {**state["planner"], "world_size": 2, "rank": r},
                    "progress": {**state["progress"], "position": position, "in_progress": in_progress},
                    "shares": {"mine": mine, "carried": torch.zeros(40, dtype=torch.bool)},
                }
            )
        )
    return two


def test_two_ranks_states_resume_in_one_process_with_nothing_lost_or_repeated():
    state = state_in_a_sifted_epoch()
    plan = state["progress"]["plan"]
    two = as_two_ranks(state, position=1)  # each rank one batch in: rank r trained order[r::2][:4]
    one = make_loader()
    one.load_state_dict_from_ranks(two)
    done = set(plan["order"][0::2][:4].tolist()) | set(plan["order"][1::2][:4].tolist())
    rest = [i for x, _ in one for i in ids_of(x)]
    assert len(rest) == len(set(rest)) and not done & set(rest)
    assert sorted(done | set(rest)) == sorted(plan["order"].tolist())
    assert one.state_dict()["pairing"]["losses_recorded"] == 2 * state["pairing"]["losses_recorded"]  # summed on rank 0


def test_states_taken_after_an_epoch_ended_resume_into_the_next_epoch_planned_for_the_new_ranks():
    state = state_in_a_sifted_epoch()
    two = as_two_ranks(state, position=3, in_progress=False)  # each rank all 3 of its batches, the iteration over
    one = make_loader()
    one.load_state_dict_from_ranks(two)
    assert not one.resuming
    ids = [i for x, _ in one for i in ids_of(x)]
    assert one.plan.epoch == 2 and one.plan.done is None  # the next epoch, planned afresh at world size 1
    assert sorted(ids) == sorted(one.plan.order.tolist()) and len(ids) == 20  # kept_share 0.5 of 40


@pytest.mark.parametrize("kind", ["subset", "drop_last"])
def test_a_sampler_and_drop_last_are_kept_when_two_ranks_resume_in_one_process(kind):
    """What the two ranks would have trained of the plan (each rank's share cut into its
    batches: with ``drop_last`` each rank's short tail is out) is what the two ranks before
    and the one process after train together; with a subset sampler nothing outside it."""
    state = state_in_a_sifted_epoch(kind)
    order = state["progress"]["plan"]["order"]
    b = 4
    shares = [order[r::2].tolist() for r in range(2)]
    trainable = [share[: (len(share) // b) * b] if kind == "drop_last" else share for share in shares]
    done = [i for share in trainable for i in share[:b]]  # one batch each
    one = make_loader(kind)
    one.load_state_dict_from_ranks(as_two_ranks(state, position=1))
    rest = [i for x, _ in one for i in ids_of(x)]
    assert len(rest) == len(set(rest)) and not set(done) & set(rest)
    assert sorted(done + rest) == sorted(i for share in trainable for i in share)
    if kind == "subset":
        assert set(rest) <= set(SPLIT)
    else:
        assert sum(len(s) for s in trainable) < len(order)  # the tails were left out, as planned


def test_states_taken_after_an_epochs_last_batch_resume_into_an_empty_rest_then_the_next_epoch():
    """A loop that saves every k steps can save after an epoch's last batch, before its
    iteration ended: the resumed loop's first iteration is that epoch's empty rest."""
    state = state_in_a_sifted_epoch()
    one = make_loader()
    one.load_state_dict_from_ranks(as_two_ranks(state, position=3))  # each rank's 3 batches trained
    assert one.resuming and len(one) == 0
    assert list(one) == []
    ids = [i for x, _ in one for i in ids_of(x)]
    assert one.plan.epoch == 2 and len(ids) == 20
