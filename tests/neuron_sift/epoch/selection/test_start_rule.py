"""The start rule (``EpochSiftConfig.start_rank_correlation``, on by default): a sifted epoch
prunes once the ranking of the scores predicts itself one epoch ahead; before that it trains
every sample (kind ``held``). Decided at each opening, the same on every rank and under
either score table, recorded in the history and ``metrics()``, and the same after a resume
at the same or another world size."""

import copy

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader
from neuron_sift.epoch.selection.start_rule import StartRule, pearson
from neuron_sift.shared.checkpoints import CHECKSUM, content_checksum
from tests.neuron_sift.epoch.helpers import IdDataset, ids_of, oracle_loss
from tests.neuron_sift.epoch.thread_runs import N, Stop, segments, train

RULE = {"start_rank_correlation": 0.5}


def rule(n=6, threshold=0.5):
    config = EpochSiftConfig(start_rank_correlation=threshold)
    return StartRule(config, n, lambda s: s.numpy().argsort().argsort().astype(np.float32) / n, lambda t: t)


def ranked(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_the_first_opening_has_nothing_to_compare_and_a_stable_ranking_starts_pruning():
    r = rule()
    everyone = torch.arange(6)
    first = r.observe(ranked(1, 2, 3, 4, 5, 6), None, sifted=True)
    assert not first.prune and first.rank_correlation is None
    same = r.observe(ranked(10, 20, 30, 40, 50, 60), everyone, sifted=True)  # the same ranking
    assert same.prune and same.rank_correlation == pytest.approx(1.0)


def test_a_reshuffled_ranking_holds_and_once_started_pruning_goes_on():
    r = rule()
    everyone = torch.arange(6)
    r.observe(ranked(1, 2, 3, 4, 5, 6), None, sifted=True)
    held = r.observe(ranked(6, 5, 4, 3, 2, 1), everyone, sifted=True)
    assert not held.prune and held.rank_correlation == pytest.approx(-1.0)
    assert "rank correlation -1.000 < start_rank_correlation=0.5" in held.reason(0.5)
    assert r.observe(ranked(6, 5, 4, 3, 2, 1), everyone, sifted=True).prune  # stable now: started
    later = r.observe(ranked(1, 2, 3, 4, 5, 6), everyone, sifted=True)  # reshuffled again: still pruning
    assert later.prune and later.rank_correlation == pytest.approx(-1.0)


def test_only_samples_trained_and_scored_at_both_openings_count_and_only_sifted_epochs_start_it():
    r = rule()
    r.observe(ranked(1, 2, 3, float("nan"), 5, 6), None, sifted=False)
    # only 0, 1, 2 trained (3 unscored before): their order holds although 4 and 5 swapped
    decision = r.observe(ranked(1, 2, 3, 4, 6, 5), torch.tensor([0, 1, 2, 3]), sifted=False)
    assert decision.rank_correlation == pytest.approx(1.0) and not decision.prune  # a warm-up epoch: no start
    assert pearson(torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)) is None  # one pair
    off = StartRule(EpochSiftConfig(start_rank_correlation=None), 6, None, None)
    assert off.observe(ranked(1, 2, 3, 4, 5, 6), None, sifted=True).prune and off.previous.size == 0


def reshuffling_then_stable(ids: torch.Tensor, epoch: int) -> torch.Tensor:
    """Losses whose ranking is a new shuffle in epochs 0 and 1 and the same from epoch 2 on:
    a model that leaves a plateau after two epochs."""
    g = torch.Generator().manual_seed(min(epoch, 2) + 100)
    table = torch.rand(N, generator=g) + 0.01
    return table[ids]


@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize("world", [1, 2])
def test_pruning_starts_once_the_ranking_holds_the_same_on_every_rank(monkeypatch, table, world):
    run = train(monkeypatch, world, {"score_table": table, **RULE}, loss=reshuffling_then_stable, epochs=8)
    kinds = [[h["kind"] for h in r] for r in run.history]
    # opening 1: nothing to compare; 2 and 3: epochs 0, 1 and 2 each reshuffled; 4: epoch 3 kept epoch 2's
    assert kinds[0] == ["warmup", "held", "held", "held", "sift", "sift", "sift", "anneal"]
    correlations = [[h["rank_correlation"] for h in r] for r in run.history]
    assert all(c == correlations[0] for c in correlations) and all(k == kinds[0] for k in kinds)
    first, *held, started = correlations[0][1:5]
    assert first is None and all(abs(c) < 0.5 for c in held) and started == pytest.approx(1.0)
    assert correlations[0][0] is None and correlations[0][-1] is None  # only sifted epochs are decided
    assert all(h["kept"] == N for h in run.history[0][:4])  # held: every sample


CASES = {
    "mid-epoch-same-world": ([2, 2], [Stop(3, 2)]),
    "epoch-end-another-world": ([2, 3], [Stop(2, None)]),
    "mid-epoch-another-world": ([3, 1], [Stop(3, 1)]),
}


@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize("case", CASES)
def test_a_resumed_run_decides_as_the_uninterrupted_one(monkeypatch, table, case):
    worlds, stops = CASES[case]
    cfg = {"score_table": table, **RULE}
    whole = train(monkeypatch, worlds[0], cfg, loss=reshuffling_then_stable, epochs=8)
    runs = segments(monkeypatch, worlds, stops, cfg, loss=reshuffling_then_stable, epochs=8)
    decided = [(h["kind"], h["rank_correlation"]) for h in whole.history[0]]
    resumed = [(h["kind"], h["rank_correlation"]) for h in runs[-1].history[0]]
    assert [k for k, _ in resumed] == [k for k, _ in decided]
    for (_, a), (_, b) in zip(resumed, decided):
        assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, abs=1e-6))


def loader(cfg=None, epochs=6):
    dl = DataLoader(IdDataset(48), batch_size=8, shuffle=True)
    return EpochSiftingDataloader({"seed": 2, "kept_share": 0.5, **(cfg or {})}, dl, num_epochs=epochs)


def train_epochs(loader, epochs):
    for _ in range(epochs):
        for x, _y in loader:
            loader.weighted_loss(oracle_loss(x))


def test_lengths_count_the_first_scored_epoch_held_and_are_exact_only_without_the_rule():
    on, off = loader(), loader({"start_rank_correlation": None})
    assert [on.planner.epoch_batches(e) for e in range(6)] == [6, 6, 3, 3, 3, 3]  # epoch 1 held
    assert [off.planner.epoch_batches(e) for e in range(6)] == [6, 3, 3, 3, 3, 3]
    assert on.planned_steps() == 24 and not on.length_is_exact and off.length_is_exact
    train_epochs(on, 3)  # oracle losses: a stable ranking, so epoch 2 pruned as estimated
    assert [h["kind"] for h in on.history] == ["warmup", "held", "sift"]
    metrics = on.metrics()
    assert metrics["epoch_kind"] == "sift" and metrics["rank_correlation"] == pytest.approx(1.0)


def test_a_state_of_0_8_resumes_and_its_next_sifted_epoch_holds():
    """A version-2 state (0.6.0 to 0.8.0) has no percentiles of an earlier opening: the run
    resumes, and the next sifted epoch has nothing to compare with, so it trains every sample."""
    first = loader()
    train_epochs(first, 3)
    state = copy.deepcopy(first.state_dict())
    del state["start"]
    state["version"] = 2
    state[CHECKSUM] = content_checksum(state)
    resumed = loader()
    resumed.load_state_dict(state)
    train_epochs(resumed, 2)
    assert [h["kind"] for h in resumed.history] == ["warmup", "held", "sift", "held", "sift"]
    assert resumed.history[3]["rank_correlation"] is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["start"].update(previous=torch.zeros(5)), r"start\.previous must hold 48 entries .* or none"),
        (lambda s: s["start"].update(previous=torch.full((48,), 1.5)), r"start\.previous holds 1\.5, must be <= 1\.0"),
        (lambda s: s["start"].update(started=1), r"start\.started must be a bool"),
        (lambda s: s["start"].pop("started"), r"start has no started"),
    ],
)
def test_a_bad_start_state_is_refused_naming_the_field(edit, message):
    first = loader()
    train_epochs(first, 2)
    state = copy.deepcopy(first.state_dict())
    edit(state)
    del state[CHECKSUM]
    with pytest.raises(ValueError, match=message):
        loader().load_state_dict(state)


def test_samples_trained_record_their_ids():
    """Guards the helper the tests above rely on: the ids come back from the batches."""
    first = loader()
    x, _y = next(iter(first))
    assert len(ids_of(x)) == 8
