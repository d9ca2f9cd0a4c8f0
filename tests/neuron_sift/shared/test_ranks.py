"""Collectives (``neuron_sift.shared.ranks.RankGroup``): a no-op for one process, the real
all-reduce and all-gather over two gloo ranks under torchrun."""

import os

import pytest
import torch
import torch.distributed as dist

from neuron_sift.shared.ranks import RankGroup
from tests.neuron_sift import torchrun


@pytest.mark.parametrize("enabled", [None, False])
def test_without_a_process_group_it_is_rank_0_of_1_and_every_collective_is_the_identity(enabled):
    assert not dist.is_initialized()
    group = RankGroup(enabled, torch.device("cpu"))
    assert (group.active, group.rank, group.world_size, group.device) == (False, 0, 1, torch.device("cpu"))
    assert group.min_int(5) == 5 and group.min_int(-3) == -3
    t = torch.tensor([[1.5, 2.0]])
    assert group.sum(t) is t
    assert group.all_gather_rows(t) is t
    assert group.received_bytes == 0  # nothing crossed


def test_asking_for_distributed_without_a_process_group_is_refused():
    with pytest.raises(RuntimeError, match="distributed=True but torch.distributed is not initialised"):
        RankGroup(True, torch.device("cpu"))


def test_a_process_group_of_one_rank_is_inactive(tmp_path):
    """A group of world size 1 has nothing to agree on: no collective is issued."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert not RankGroup(None, torch.device("cpu")).active
        with pytest.raises(RuntimeError, match="distributed=True"):
            RankGroup(True, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


WORKER = os.path.join(os.path.dirname(__file__), "ranks_worker.py")


@pytest.mark.slow
def test_two_gloo_ranks(tmp_path):
    """Each rank contributes values of its own; every rank gets the same answers."""
    runs = torchrun.results(torchrun.launch(WORKER, tmp_path, 2), 2)
    for rank, r in enumerate(runs):
        assert (r["rank"], r["world_size"], r["active"]) == (rank, 2, True)
        assert r["min"] == 3  # min(3 + 0, 3 + 1)
        assert r["sum"] == [[1.0, 2.0], [2.0, 2.0]]  # [rank, 1] and [[1, 1], [1, 1]] summed
        assert r["sum_dtype"] == "torch.int64"
        assert r["gathered"] == [[0.0, 0.0], [1.0, 10.0]]  # rank order
        assert r["disabled"] == [False, 0, 1, 7]  # distributed=False: rank 0 of 1, no collective
        assert r["received_bytes"] == [4 * 8 + 2 * 2 * 4 + 8, 0]  # the sum's int64s, the gather's rows, the min
