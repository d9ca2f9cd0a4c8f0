"""The epoch loader with a reference table (``selection/reference_scores.py``): a sifted
epoch 0 planned from minus the reference loss, excess loss once scores exist, the start rule
off, and the table's checks (size, coverage, a resume with another table)."""

import copy

import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader, ReferenceTable
from tests.neuron_sift.epoch.helpers import IdDataset, ids_of
from tests.neuron_sift.epoch.thread_runs import N, train


def noisy(ids):
    """Half the samples, 2, 3, 6, 7, 10, ...: spread over both ranks' shards (a sharded table
    at two ranks owns the even ids on one rank, the odd ones on the other)."""
    return (ids // 2) % 2


def noisy_reference(n: int = N) -> ReferenceTable:
    """Reference losses: the noisy half high (5.x), the rest low (0.x), all distinct."""
    ids = torch.arange(n, dtype=torch.float32)
    return ReferenceTable.from_losses(5.0 * noisy(ids) + ids / (10 * n))


def noisy_is_hard(ids: torch.Tensor, epoch: int) -> torch.Tensor:
    """Training losses: the noisy half higher (2 above the rest), so raw loss favours them."""
    return (1.0 + 2.0 * noisy(ids) + ids.double() / (10 * N)).float()


def noisy_share(trained: list[int]) -> float:
    """The noisy half's share of ``trained``."""
    return sum(noisy(i) for i in trained) / max(len(trained), 1)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_epoch_0_is_planned_from_the_reference_and_keeps_the_low_reference_losses(monkeypatch, table, world):
    cfg = {"warmup_epochs": 0, "score_table": table}
    run = train(monkeypatch, world, cfg, loader_kwargs={"reference": noisy_reference()})
    without = train(monkeypatch, world, cfg)
    assert run.history[0][0]["kind"] == "sift" and without.history[0][0]["kind"] == "warmup"
    trained = run.trained(0)
    assert len(trained) == len(set(trained)) == N // 2  # the budget, each sample once
    assert noisy_share(trained) < 0.4  # percentile priorities: a clean sample about 3 times as likely
    assert noisy_share(without.trained(0)) == 0.5  # every sample


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_later_epochs_rank_the_excess_loss_and_the_start_rule_does_not_hold_them(monkeypatch, table):
    # The start rule is on by default (0.5); the reference makes it step aside.
    cfg = {"score_table": table, "start_rank_correlation": 0.5}
    run = train(monkeypatch, 2, cfg, loss=noisy_is_hard, loader_kwargs={"reference": noisy_reference()})
    raw = train(monkeypatch, 2, cfg, loss=noisy_is_hard)
    assert [h["kind"] for h in run.history[0]][:3] == ["warmup", "sift", "sift"]
    assert [h["kind"] for h in raw.history[0]][:2] == ["warmup", "held"]
    # excess: noisy 3 - 5 < clean 1 - 0 (plus small terms): the clean half ranks higher
    assert noisy_share(run.trained(1)) < 0.4
    assert noisy_share(raw.trained(2)) > 0.6  # raw loss: the noisy half


@pytest.mark.parametrize(("table", "world"), [("replicated", 1), ("sharded", 2)])
def test_unscored_samples_get_the_median_excess_neither_forced_in_nor_left_out(monkeypatch, table, world):
    """After a sifted epoch 0 half the samples have no score yet: they rank at the scored
    ones' median excess (over every rank's) instead of being forced in (which would take the
    whole budget)."""
    cfg = {"warmup_epochs": 0, "score_table": table}
    run = train(monkeypatch, world, cfg, loss=noisy_is_hard, loader_kwargs={"reference": noisy_reference()})
    first, second = set(run.trained(0)), set(run.trained(1))
    assert run.history[0][1]["kind"] == "sift"
    assert second & first and second - first  # both scored and unscored samples are drawn


def loader(reference, n=48, **cfg):
    dl = DataLoader(IdDataset(n), batch_size=8, shuffle=True)
    return EpochSiftingDataloader({"seed": 1, "kept_share": 0.5, **cfg}, dl, num_epochs=4, reference=reference)


def test_a_table_of_another_size_or_missing_a_sample_is_refused_naming_it():
    with pytest.raises(ValueError, match="has losses for 40 samples, but the dataset has 48"):
        loader(noisy_reference(40))
    losses = noisy_reference(48).losses().clone()
    losses[17] = float("nan")
    with pytest.raises(ValueError, match="sample id 17 has no loss in the reference table"):
        loader(ReferenceTable.from_losses(losses))
    with pytest.raises(TypeError, match="reference must be a ReferenceTable"):
        loader(torch.zeros(48))


def test_a_checkpoint_resumes_only_with_the_table_it_was_taken_with():
    whole = loader(noisy_reference(48), warmup_epochs=0)
    batches = []
    for x, _y in whole:
        batches.append(ids_of(x))
        whole.weighted_loss(noisy_is_hard(torch.tensor(ids_of(x)), 0))
    first = loader(noisy_reference(48), warmup_epochs=0)
    it = iter(first)
    x, _y = next(it)
    first.weighted_loss(noisy_is_hard(torch.tensor(ids_of(x)), 0))
    state = copy.deepcopy(first.state_dict())
    with pytest.raises(ValueError, match="reference"):
        loader(None, warmup_epochs=0).load_state_dict(state)
    other = noisy_reference(48).losses() + 1.0
    other[0] = float("nan")  # a table that does not cover the dataset is refused when built
    with pytest.raises(ValueError, match="no loss"):
        loader(ReferenceTable.from_losses(other), warmup_epochs=0)
    again = loader(noisy_reference(48), warmup_epochs=0)
    again.load_state_dict(state)
    assert [ids_of(x) for x, _y in again] == batches[1:]  # the rest of epoch 0, exactly
