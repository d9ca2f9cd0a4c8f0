"""The noise guard when every score is at or above its quantile (all losses equal, say).

Its streaks then cover every sample a rank could keep; an epoch of nothing cannot be
planned (it raised an internal error before 0.8.0), so the guard leaves nothing out that
epoch and warns, under either score table and on every rank alike.
"""

import logging

import pytest
import torch

from tests.neuron_sift.epoch.thread_runs import train


def equal_loss(ids: torch.Tensor, epoch: int) -> torch.Tensor:
    return torch.ones(ids.shape[0])


@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize("world", [1, 2])
def test_every_sample_at_the_quantile_trains_the_budget_and_warns(monkeypatch, caplog, table, world):
    config = {"score_table": table, "noise_guard_epochs": 1, "kept_share": 0.5}
    with caplog.at_level(logging.WARNING):
        run = train(monkeypatch, world, config, loss=equal_loss)
    history = run.history[0]
    sifted = [h for h in history if h["kind"] == "sift"]
    assert len(sifted) >= 2  # the guard's streaks are set after the first sifted epoch: later ones hit the case
    assert all(h["excluded"] == 0 for h in sifted)
    assert all(h["kept"] == sifted[0]["kept"] > 0 for h in sifted)  # the budget, every sifted epoch
    decided = [[(h["kind"], h["kept"], h["excluded"]) for h in r] for r in run.history]
    assert all(d == decided[0] for d in decided)  # every rank decided alike
    warned = [r.getMessage() for r in caplog.records if "noise guard" in r.getMessage()]
    assert warned and all("none is left out this epoch" in m for m in warned)


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_a_guard_that_leaves_some_samples_still_excludes(monkeypatch, table):
    """Distinct losses: the guard leaves out the top ones as before (the fallback is only for
    nothing left)."""
    config = {"score_table": table, "noise_guard_epochs": 1, "kept_share": 0.5}
    run = train(monkeypatch, 1, config, loss=lambda ids, epoch: ids.float() + 1.0)
    assert any(h["excluded"] > 0 for h in run.history[0] if h["kind"] == "sift")
