"""What a rank of a sharded score table shares (``neuron_sift.epoch.scores.owned_shares``).
What users rely on: an epoch opens this rank's own scores (none when it plans without
scores), with no collective; after an epoch resumed at another world size, whose rest
was dealt out whatever the owners, every score a rank recorded for a sample it only
hosted reaches that sample's owner, on every rank alike, and the table shrinks back to
the owned samples; the state is empty, and anything else is refused."""

import numpy as np
import pytest
import torch

from neuron_sift import EpochSiftConfig
from neuron_sift.epoch.planning.plan import EpochPlan, PlanSettings
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from neuron_sift.epoch.scores.owned_shares import OwnedShares
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.shared.ranks import RankGroup
from tests.neuron_sift.epoch.thread_ranks import run_ranks

N = 8
CONFIG = EpochSiftConfig(score_table="sharded", kept_share=0.5)


def sharded(ranks):
    return ShardedPlanner(PlanSettings(CONFIG, N, 2, False, 0, 4, ranks.world_size, ranks.rank), ranks)


def test_an_epoch_opens_this_ranks_own_scores_or_none():
    planner = sharded(RankGroup(False, torch.device("cpu")))
    shares, tables = OwnedShares(planner), ScoreTables(planner.table_size)
    tables.record(np.array([1, 6]), torch.tensor([0.25, 0.75]))
    assert shares.open_scores(tables, None, needs_scores=False) is None
    opened = shares.open_scores(tables, None, needs_scores=True)
    assert opened[[1, 6]].tolist() == [0.25, 0.75] and int(opened.isnan().sum()) == N - 2


def resumed_plan():
    """Sifted epoch 1 of a run at one rank, resumed at two after ``6`` and ``7`` trained: the
    rest ``0 2 1 3 4 5`` is dealt out as ``[0 1] [4]`` to rank 0 and ``[2 3] [5]`` to rank 1,
    so rank 0 hosts sample 1 (rank 1's) and rank 1 hosts sample 2 (rank 0's)."""
    order = torch.tensor([0, 2, 1, 3, 4, 6, 5, 7])
    return EpochPlan(1, "sift", order, torch.ones(5), None, 0, world_size=1, done=torch.tensor([6, 7]))


@pytest.mark.parametrize("needs_scores", [True, False])
def test_after_an_epoch_resumed_at_another_world_size_the_hosted_scores_reach_their_owners(needs_scores):
    def rank(ranks):
        planner = sharded(ranks)
        shares, plan = OwnedShares(planner), resumed_plan()
        shares.load_state_dict({}, plan)  # hosts the plan's guests after the owned slots
        guests = planner.owner.guests.tolist()
        tables = ScoreTables(planner.table_size)
        owned = planner.owner.ids()
        tables.load_scores(torch.cat([torch.from_numpy(owned).float() + 100, torch.full((len(guests),), np.nan)]))
        ids = np.concatenate(planner.rank_batches_of(plan))
        tables.record(planner.slots(ids), torch.from_numpy(ids).float() + 0.5)  # this epoch's losses
        opened = shares.open_scores(tables, plan, needs_scores)
        return guests, opened, tables.snapshot(), planner.table_size, planner.owner.guests.size

    (guests0, opened0, table0, size0, left0), (guests1, opened1, table1, size1, left1) = run_ranks(2, rank)
    assert (guests0, guests1) == ([1], [2])
    # rank 0 owns 0 2 4 6: 2 trained on rank 1, 6 before the resume (its score as it was)
    assert table0.tolist() == [0.5, 2.5, 4.5, 106.0]
    assert table1.tolist() == [1.5, 3.5, 5.5, 107.0]  # rank 1 owns 1 3 5 7: 1 trained on rank 0
    assert (size0, size1, left0, left1) == (4, 4, 0, 0)  # back to the owned samples, no guest left
    if needs_scores:
        assert opened0.tolist() == table0.tolist() and opened1.tolist() == table1.tolist()
    else:
        assert opened0 is None and opened1 is None


def test_the_state_is_empty_and_anything_else_is_refused():
    """(A non-empty one, as a replicated table's: ``resuming/test_bad_states.py``.)"""
    planner = sharded(RankGroup(False, torch.device("cpu")))
    shares = OwnedShares(planner)
    assert shares.state_dict() == {}
    shares.load_state_dict({}, None)
    assert planner.owner.guests.size == 0
    with pytest.raises(ValueError, match=r"invalid checkpoint: shares must be a dict, got NoneType"):
        shares.load_state_dict(None, None)
