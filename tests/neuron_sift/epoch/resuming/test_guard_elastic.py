"""The noise guard on several ranks (threads, ``thread_runs.py``): its streaks follow the
documented rule (above the ``noise_guard_quantile`` of all ranks' scores) under both tables,
each sifted plan leaves out exactly the samples whose streak reached ``noise_guard_epochs``
and whose score is above that quantile, and a
run resumed at another world size (mid-epoch or after an epoch's end, once or twice) moves
the streaks of every sample its epoch trained, before the checkpoint or after, wherever it
trained: the uninterrupted run's streaks."""

import pytest
import torch

from tests.neuron_sift.epoch.thread_runs import N, Stop, expected_guard, segments, train

GUARD = {"noise_guard_epochs": 2, "noise_guard_quantile": 0.8, "warmup_epochs": 2}
SIFTED = (2, 3)  # warm-up 0 and 1, sifted 2 and 3, annealing 4
MOVES = (1, 2, 3)  # the openings that plan from scores: the guard moves there


@pytest.mark.parametrize("name", ["replicated", "sharded"])
@pytest.mark.parametrize("world", [2, 3])
def test_streaks_follow_the_quantile_of_all_ranks_scores_and_plans_leave_those_out(monkeypatch, name, world):
    run = train(monkeypatch, world, {"score_table": name, **GUARD})
    expected = expected_guard(run.batches, list(MOVES), N, 0.8, 2)
    for e in MOVES:
        assert torch.equal(run.by_id(e, "streaks").long(), expected[e].streaks), e
    for e in SIFTED:
        out = expected[e].excluded
        assert 0 < len(out) <= 0.2 * N  # the guard leaves some out, at most a fifth
        assert not out & set(run.trained(e))  # none of them trained
        assert all(h[e]["excluded"] == len(out) for h in run.history), e
    assert expected[1].streaks.max() == 1 and expected[2].streaks.max() == 2


CASES = {
    "mid-epoch": ([2, 3], [Stop(2, 2)]),
    "epoch-end": ([2, 3], [Stop(2, None)]),
    "mid-epoch-to-one": ([3, 1], [Stop(2, 1)]),
    "mid-epoch-twice": ([2, 3, 2], [Stop(2, 2), Stop(2, 1)]),
    "end-then-mid": ([3, 2, 1], [Stop(1, None), Stop(2, 2)]),
}


@pytest.mark.parametrize("name", ["replicated", "sharded"])
@pytest.mark.parametrize("case", CASES)
def test_an_elastic_resume_keeps_the_uninterrupted_runs_streaks(monkeypatch, name, case):
    worlds, stops = CASES[case]
    cfg = {"score_table": name, **GUARD}
    whole = train(monkeypatch, worlds[0], cfg)
    runs = segments(monkeypatch, worlds, stops, cfg)
    epoch = stops[-1].epoch
    after = epoch + 1
    streaks = runs[-1].by_id(after, "streaks").long()
    assert torch.equal(streaks, whole.by_id(after, "streaks").long())
    batches = [b for r in runs for b in r.batches]
    expected = expected_guard(batches, list(MOVES), N, 0.8, 2)[after]
    assert torch.equal(streaks, expected.streaks)
    # The case the resume must not miss: samples trained before the (last) checkpoint whose streaks moved.
    before = {i for r in runs[:-1] for i in r.trained(epoch)}
    at_start = whole.by_id(epoch, "streaks").long()
    assert any(streaks[i] != at_start[i] for i in before)
    out = expected.excluded  # the next sifted epoch leaves them out
    assert after in SIFTED and out and not out & set(runs[-1].trained(after))
    assert all(h[after]["excluded"] == len(out) for h in runs[-1].history)
