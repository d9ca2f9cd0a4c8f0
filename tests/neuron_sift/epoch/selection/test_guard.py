"""The label-noise guard's streaks (``neuron_sift.epoch.selection.guard.NoiseGuard``), as
``EpochSiftConfig`` states them: a sample's streak counts the epochs in a row in which it
was trained and scored above the ``noise_guard_quantile`` of all scores (the lowest score
with at least that share at or below it; a tie with it is not above); a trained sample
scored at or below resets it; a sample not trained, or trained without a recorded score,
keeps it; sifted plans leave out the samples whose streak reached ``noise_guard_epochs``
and whose score is above the quantile, so never more than ``1 - q`` of the scored samples.
With the guard off it holds no streaks at all. (On a loader: ``test_user_behaviours.py``;
on several ranks and across resumes: ``resuming/test_guard_elastic.py``.)"""

import pytest
import torch

from neuron_sift import EpochSiftConfig
from neuron_sift.epoch.selection.guard import NoiseGuard
from tests.helpers.state_roundtrip import roundtrip

NAN = float("nan")


def guard(epochs=2, quantile=0.5, n=6):
    return NoiseGuard(EpochSiftConfig(noise_guard_epochs=epochs, noise_guard_quantile=quantile), n)


def ids(*values):
    return torch.tensor(values, dtype=torch.int64)


def test_trained_samples_above_the_quantile_of_all_scores_extend_their_streak():
    g = guard()
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # the 0.5 quantile of all six: 3.0
    g.update(scores, ids(0, 1, 3, 4))  # 2 and 5 not trained: the quantile is still of every score
    assert g.threshold == 3.0 and g.streak.tolist() == [0, 0, 0, 1, 1, 0]
    at = guard(n=5)
    at.update(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), ids(2, 3))  # 3.0 is the quantile: a tie is not above
    assert at.streak.tolist() == [0, 0, 0, 1, 0]
    unscored = guard(n=6, quantile=0.8)  # NaN (never scored) is left out of the quantile, not counted as 0
    unscored.update(torch.tensor([NAN, NAN, NAN, 5.0, 6.0, 7.0]), ids(3, 4, 5))
    assert unscored.threshold == 7.0 and unscored.streak.tolist() == [0] * 6


def test_ties_at_the_quantile_are_not_above_it_and_exclusions_never_exceed_one_minus_q():
    """A trained classifier: most losses exactly 0.0. In 0.8.0 every one of them counted as
    high (``>=`` a quantile of 0.0) and the guard left out nearly every clean sample."""
    g = guard(epochs=1, quantile=0.8, n=10)
    zeros = torch.tensor([0.0] * 9 + [3.0])
    g.update(zeros, ids(*range(10)))
    assert g.threshold == 0.0 and g.streak.tolist() == [0] * 9 + [1]
    assert g.excluded(zeros).tolist() == [False] * 9 + [True]
    g.streak.fill_(5)  # whatever the streaks: at most 1 - q of the scored samples are above the threshold
    scores = torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, NAN])
    g.update(scores, None)
    assert g.threshold == 3.0 and g.excluded(scores).tolist() == [False] * 8 + [True, False]


def test_a_trained_sample_scored_below_resets_and_an_untrained_or_unscored_one_keeps_its_streak():
    g = guard(epochs=5)
    high = torch.tensor([1.0, 1.0, 1.0, 9.0, 9.0, 9.0])
    g.update(high, ids(3, 4, 5))
    g.update(high, ids(3, 4, 5))
    assert g.streak.tolist() == [0, 0, 0, 2, 2, 2]
    fell = torch.tensor([1.0, 1.0, 1.0, 0.5, 9.0, NAN])  # 3 fell; 4 not trained; 5 trained, no score recorded
    g.update(fell, ids(3, 5))
    assert g.streak.tolist() == [0, 0, 0, 0, 2, 2]


def test_plans_leave_out_the_samples_whose_streak_reached_noise_guard_epochs():
    g = guard(epochs=2)
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert g.excluded(scores).tolist() == [False] * 6
    g.update(scores, ids(0, 1, 2, 3, 4, 5))
    assert g.excluded(scores).tolist() == [False] * 6  # one epoch high is not yet a streak of two
    g.update(scores, ids(0, 1, 2, 3, 4, 5))
    assert g.excluded(scores).tolist() == [False, False, False, True, True, True]
    fallen = torch.tensor([1.0, 2.0, 3.0, 0.5, 5.0, 6.0])  # 3's score is no longer above the quantile
    g.update(fallen, None)
    assert g.excluded(fallen).tolist() == [False, False, False, False, True, True]


def test_no_epoch_trained_yet_or_no_score_recorded_changes_nothing():
    g = guard()
    g.update(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), None)  # the first epoch: nothing trained before
    g.update(torch.full((6,), NAN), ids(0, 1, 2))  # no quantile of no scores
    assert g.streak.tolist() == [0] * 6


def test_with_the_guard_off_there_are_no_streaks_and_nothing_is_left_out():
    g = guard(epochs=0)
    g.update(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), ids(3, 4, 5))
    assert g.excluded() is None and g.streak.numel() == 0  # no memory per sample while off


def test_streaks_survive_a_checkpoint_and_a_state_without_streaks_loads_as_none_yet():
    g = guard()
    g.update(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), ids(3, 4, 5))
    state = roundtrip(g.state_dict())
    g.update(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), ids(3, 4, 5))
    assert state["streak"].tolist() == [0, 0, 0, 1, 1, 1]  # the saved state is a copy
    again = guard()
    again.load_state_dict(state)
    assert again.streak.tolist() == [0, 0, 0, 1, 1, 1]
    off = roundtrip(guard(epochs=0).state_dict())  # a run with the guard off, resumed with it on
    turned_on = guard()
    turned_on.load_state_dict(off)
    assert turned_on.streak.tolist() == [0] * 6
    turned_off = guard(epochs=0)
    turned_off.load_state_dict(state)  # and the other way: the streaks are dropped
    assert turned_off.streak.numel() == 0 and turned_off.excluded() is None


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({}, r"guard has no streak"),
        ({"streak": torch.zeros(4, dtype=torch.int32)}, r"guard\.streak must hold 6 entries .* or none, got 4"),
    ],
)
def test_a_bad_state_is_refused_and_the_streaks_stay(state, message):
    g = guard()
    g.update(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), ids(3))
    with pytest.raises(ValueError, match=message):
        g.load_state_dict(state)
    assert g.streak.tolist() == [0, 0, 0, 1, 0, 0]
