"""Data-parallel runs of the epoch loader as users run them, on several ranks (threads of this
process, ``thread_runs.py``), under both score tables: resumed at another world size once and
twice, mid-epoch and after an epoch's end, against the uninterrupted run; each sifted epoch
its own draw; ``max_weight`` honoured; a prefetching loop's late losses weighted by their
own epoch's plan; the history and ``metrics()`` of all ranks on every rank."""

import math

import pytest
import torch

from tests.neuron_sift.epoch.thread_runs import (
    EPOCHS,
    N,
    Stop,
    fixed_loss,
    joined,
    segments,
    train,
)

TABLES = ["replicated", "sharded"]
GUARD = {"noise_guard_epochs": 2, "warmup_epochs": 2}  # streaks build over the two warm-up epochs


def table(name, **more):
    return {"score_table": name, **more}


def assert_same_weights(got, expected, where):
    assert got.keys() <= expected.keys(), where
    bad = {i: (got[i], expected[i]) for i in got if not math.isclose(got[i], expected[i], rel_tol=1e-5)}
    assert not bad, f"{where}: weights differ (got, expected) for {dict(list(bad.items())[:5])}"


def assert_trains_the_plans_weights(run):
    """Every batch of an epoch this run opened was weighted as the epoch's plan weighs it."""
    for epoch in {o.epoch for o in run.openings}:
        plan = run.by_id(epoch, "weights")
        assert_same_weights(run.weights(epoch), {i: float(plan[i]) for i in run.trained(epoch)}, f"epoch {epoch}")


def assert_resumed_as_uninterrupted(whole, runs, epoch):
    """The epoch the states were taken in, joined over the runs: the uninterrupted run's
    samples, each once and with its weight there; every rank of each run in lockstep; the
    next epoch opens from the uninterrupted run's scores (and streaks)."""
    ids, weights = joined(runs, epoch)
    assert len(ids) == len(set(ids)), "a sample trained twice"
    assert sorted(ids) == sorted(whole.trained(epoch)), "samples left out or added"
    assert_same_weights(weights, whole.weights(epoch), f"epoch {epoch}")
    for run in runs:
        assert len(set(run.steps(epoch))) == 1, run.steps(epoch)
    last = runs[-1]
    for what in ("scores", "streaks") if whole.openings[0].streaks.numel() else ("scores",):
        torch.testing.assert_close(
            last.by_id(epoch + 1, what), whole.by_id(epoch + 1, what), rtol=0, atol=0, equal_nan=True
        )
    for run in runs:
        assert_trains_the_plans_weights(run)


def assert_later_epochs_hold(whole, last, epoch):
    """After the resume: each epoch trains its plan over all ranks, each sample once, in
    lockstep; a replicated table's plans (counts that every world size divides) are the
    uninterrupted run's."""
    for e in range(epoch + 1, EPOCHS):
        ids = last.trained(e)
        assert len(ids) == len(set(ids)) and sorted(ids) == sorted(last.plan_ids(e)), e
        assert len(set(last.steps(e))) == 1
        if not last.sharded:
            assert sorted(ids) == sorted(whole.trained(e))
            assert_same_weights(last.weights(e), whole.weights(e), f"epoch {e}")


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("worlds", [[2, 3], [3, 2], [2, 1]])
@pytest.mark.parametrize("stop", [Stop(2, 2), Stop(2, None)], ids=["mid-epoch", "epoch-end"])
def test_a_resume_at_another_world_size_continues_the_uninterrupted_run(monkeypatch, name, worlds, stop):
    cfg = table(name, **GUARD)
    whole = train(monkeypatch, worlds[0], cfg)
    runs = segments(monkeypatch, worlds, [stop], cfg)
    assert_resumed_as_uninterrupted(whole, runs, stop.epoch)
    assert_later_epochs_hold(whole, runs[-1], stop.epoch)
    if stop.batches is not None:  # the rest of a sifted epoch: its weights are not all 1
        assert any(w > 1.01 for w in runs[-1].weights(stop.epoch).values())


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("worlds", [[2, 3, 2], [3, 2, 1], [2, 3, 3]])
def test_an_epoch_resumed_twice_at_other_world_sizes_continues_the_uninterrupted_run(monkeypatch, name, worlds):
    cfg = table(name, **GUARD)
    whole = train(monkeypatch, worlds[0], cfg)
    stops = [Stop(2, 2), Stop(2, 1)]
    runs = segments(monkeypatch, worlds, stops, cfg)
    assert_resumed_as_uninterrupted(whole, runs, 2)
    assert_later_epochs_hold(whole, runs[-1], 2)
    middle = runs[1]
    if name == "sharded":  # the middle run trained samples it hosts for their owners (guests)
        guests = [i for b in middle.of_epoch(2) for i in b.ids if i % middle.world != b.rank]
        assert guests
        newer = {i: s for i, s in zip(guests, runs[-1].by_id(3, "scores")[guests].tolist())}
        older = whole.by_id(2, "scores")
        assert all(newer[i] != older[i] for i in guests)  # their scores at the next epoch are this epoch's


@pytest.mark.parametrize("name", TABLES)
def test_each_sifted_epoch_draws_anew_from_the_same_scores(monkeypatch, name):
    """The scores are the same at every sifted epoch's start (a loss fixed per sample), yet
    each epoch keeps another subset: the draw follows the epoch."""
    run = train(monkeypatch, 2, table(name), loss=fixed_loss)
    kept = [frozenset(run.trained(e)) for e in (1, 2, 3)]
    assert all(len(k) == 48 for k in kept)
    torch.testing.assert_close(run.by_id(1, "scores"), run.by_id(3, "scores"), rtol=0, atol=0)
    assert len(set(kept)) == 3, "two sifted epochs kept the same samples"


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("world", [2, 3])
def test_max_weight_caps_every_weight_on_every_rank(monkeypatch, name, world):
    run = train(monkeypatch, world, table(name, max_weight=2.5))
    weights = [w for b in run.batches for w in b.weights]
    assert max(weights) == pytest.approx(2.5, rel=1e-5)  # capped where 1 / pi is larger
    assert all(w <= 2.5 * (1 + 1e-5) for w in weights)
    for entries in run.history:
        assert max(h["max_weight"] for h in entries) == pytest.approx(2.5)


@pytest.mark.parametrize("name", TABLES)
def test_losses_passed_after_the_next_epoch_opened_get_their_own_epochs_weights(monkeypatch, name):
    """A prefetching loop passes each batch's losses two batches late: the last batches of
    each epoch get theirs after the next epoch opened, the last sifted epoch's after the
    annealing epoch (unit weights) opened; they are weighted by their own epoch's plan."""
    run = train(monkeypatch, 2, table(name), ahead=2)
    assert_trains_the_plans_weights(run)
    late = [b for b in run.batches if b.epoch == EPOCHS - 2 and b.opened == EPOCHS]
    assert late and any(w > 1.01 for b in late for w in b.weights)


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_history_and_metrics_report_all_ranks_on_every_rank(monkeypatch, name, world, drop_last):
    """Each epoch's entry, on every rank and under either table: ``kept`` the samples all
    ranks trained, ``planned`` those the plan drew over all ranks, the mean and largest
    weight of every trained sample; ``metrics()`` of the epoch says the same."""
    run = train(monkeypatch, world, table(name, kept_share=0.45), drop_last=drop_last)
    for e in range(EPOCHS):
        weights = list(run.weights(e).values())
        kept = len(run.trained(e))
        expected = {
            "kept": kept,
            "planned": len(run.plan_ids(e)),
            "observed_kept_share": kept / N,
            "mean_weight": sum(weights) / len(weights),
            "max_weight": max(weights),
        }
        if e in (1, 2, 3) and drop_last:
            assert expected["kept"] < expected["planned"]  # each rank's short last batch is cut
        for r in range(world):
            entry = run.history[r][e]
            got = {key: entry[key] for key in expected}
            assert got == pytest.approx(expected, rel=1e-5), (e, r)
            (opening,) = [o for o in run.opened(e) if o.rank == r]
            assert {key: opening.metrics[key] for key in ("observed_kept_share", "mean_weight", "max_weight")} == (
                pytest.approx({key: expected[key] for key in ("observed_kept_share", "mean_weight", "max_weight")})
            )
