"""Each rank's share of a replicated score table (``neuron_sift.epoch.scores.rank_shares``).
What users rely on: an epoch that plans without scores (warm-up, annealing) opens none and
starts no merge, and the samples trained meanwhile still go into the next merge; an epoch
that plans from scores gets every rank's fresh ones merged, the same on every rank and
written back into each rank's table; the marks survive a checkpoint and a bad one is
refused before anything changes. (Which value wins a merge: ``test_user_behaviours.py``.)"""

import numpy as np
import pytest
import torch

from neuron_sift.epoch.scores.rank_shares import RankShares
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.shared.ranks import RankGroup
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.thread_ranks import run_ranks

N = 6


def trained(ranks, mine):
    """A rank's shares and table after training ``mine`` (each sample's loss: its id + 0.5)."""
    shares, tables = RankShares(N, ranks), ScoreTables(N)
    ids = np.array(mine, dtype=np.int64)
    shares.planned([ids[i : i + 2] for i in range(0, len(mine), 2)])  # batches of 2
    tables.record(ids, torch.tensor(mine, dtype=torch.float32) + 0.5)
    return shares, tables


def test_an_epoch_without_scores_opens_none_and_keeps_the_marks_for_the_next_merge():
    shares, tables = trained(RankGroup(False, torch.device("cpu")), [0, 2, 4])
    assert shares.open_scores(tables, None, needs_scores=False) is None
    assert shares.mine.tolist() == [True, False, True, False, True, False]
    merged = shares.open_scores(tables, None, needs_scores=True)
    assert merged[[0, 2, 4]].tolist() == [0.5, 2.5, 4.5] and merged[[1, 3, 5]].isnan().all()
    assert not shares.mine.any()  # the next epoch's marks start over


def test_every_rank_opens_the_same_merged_scores_and_its_table_holds_them():
    def rank(ranks):
        shares, tables = trained(ranks, [[0, 1, 2], [3, 4, 5]][ranks.rank])
        merged = shares.open_scores(tables, None, needs_scores=True)
        return merged, tables.snapshot()

    (merged0, table0), (merged1, table1) = run_ranks(2, rank)
    expected = [i + 0.5 for i in range(N)]
    assert merged0.tolist() == merged1.tolist() == expected
    assert table0.tolist() == table1.tolist() == expected  # the merge is each rank's table from now on


def test_the_marks_survive_a_checkpoint_as_they_were_when_it_was_taken():
    shares, _ = trained(RankGroup(False, torch.device("cpu")), [1, 3])
    shares.carried_over(np.array([5]))
    state = roundtrip(shares.state_dict())
    shares.planned([np.array([0])])  # after the state was taken: not in it
    again = RankShares(N, RankGroup(False, torch.device("cpu")))
    again.load_state_dict(state)
    assert again.mine.tolist() == [False, True, False, True, False, False]
    assert again.carried.tolist() == [False] * 5 + [True]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([True] * N, r"shares must be a dict, got list"),
        ({"mine": torch.zeros(N, dtype=torch.bool)}, r"shares has no carried"),
        (
            {"mine": torch.zeros(N, dtype=torch.bool), "carried": torch.zeros(N - 1, dtype=torch.bool)},
            r"shares\.carried must hold 6 entries \(one per sample\), got 5",
        ),
    ],
    ids=["not-a-dict", "no-carried", "carried-short"],
)
def test_a_bad_state_is_refused_before_any_mark_changes(state, message):
    shares, _ = trained(RankGroup(False, torch.device("cpu")), [1, 3])
    with pytest.raises(ValueError, match=rf"invalid checkpoint: {message}"):
        shares.load_state_dict(state)
    assert shares.mine.tolist() == [False, True, False, True, False, False]
