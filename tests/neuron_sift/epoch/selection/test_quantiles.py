"""Percentiles from a mergeable summary (``neuron_sift.epoch.selection.quantiles``): within the stated
rank error of the exact mid-rank percentile for any split of the scores into parts, exact
where the parts are small, and the same summary on every rank of a gloo group."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_sift.epoch.selection.policies import keep_priorities
from neuron_sift.epoch.selection.policy import percentile_of_all
from neuron_sift.epoch.selection.quantiles import merge, percentiles, summarize
from tests.neuron_sift import torchrun
from tests.neuron_sift.epoch.helpers import worker

NAN = np.float32("nan")


def split(scores: np.ndarray, parts: int) -> list[np.ndarray]:
    """Sample i in part i mod parts, as ranks own them."""
    return [scores[r::parts] for r in range(parts)]


@st.composite
def tables(draw):
    """Scores with ties, signed zeros and NaNs, split into 1-4 parts, summarised with 1-64 knots."""
    n = draw(st.integers(1, 400))
    pool = draw(st.lists(st.floats(-5, 5, width=32), min_size=1, max_size=40))
    pool += [0.0, -0.0, float("nan")]
    idx = draw(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n))
    return np.array([pool[i] for i in idx], dtype=np.float32), draw(st.integers(1, 4)), draw(st.integers(1, 64))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(tables())
def test_within_the_stated_rank_error_of_the_exact_percentile(table):
    scores, parts, knots = table
    summary = merge([summarize(p, knots) for p in split(scores, parts)])
    exact = percentile_of_all(scores)
    estimate = percentiles(summary, scores)
    assert summary.count == int((~np.isnan(scores)).sum())
    assert summary.rank_error < 1.0 / knots + 1e-12  # the documented bound
    assert np.all(np.abs(estimate - exact) <= summary.rank_error + 1e-6)
    assert np.all(estimate[np.isnan(scores)] == 1.0)


def test_the_bound_is_tight_enough_to_matter_and_large_tables_stay_within_it():
    rng = np.random.default_rng(0)
    scores = rng.lognormal(size=200_000).astype(np.float32)
    scores[::101] = np.nan
    scores[3::50] = 1.0  # a run of ties
    summary = merge([summarize(p, 1024) for p in split(scores, 3)])
    error = np.abs(percentiles(summary, scores) - percentile_of_all(scores)).max()
    assert 0 < summary.rank_error < 1 / 1024
    assert summary.rank_error / 2 < error <= summary.rank_error + 1e-6  # the bound is near the worst seen


def test_parts_with_few_distinct_scores_give_the_exact_percentile():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 50, size=5_000).astype(np.float32)
    scores[::7] = NAN
    summary = merge([summarize(p, 64) for p in split(scores, 4)])
    assert summary.rank_error == 0.0
    assert np.array_equal(percentiles(summary, scores), percentile_of_all(scores))  # the same float32 arithmetic


def test_merge_is_independent_of_the_order_and_grouping_of_parts():
    rng = np.random.default_rng(2)
    parts = [summarize(p, 32) for p in split(rng.random(3_000).astype(np.float32), 3)]
    a = merge(parts)
    b = merge([merge(parts[2:]), merge(parts[:2])])
    assert np.array_equal(a.values, b.values) and np.array_equal(a.weights, b.weights)
    assert (a.count, a.uncertain) == (b.count, b.uncertain) and a.total == pytest.approx(b.total)


def test_empty_parts_and_unscored_tables():
    empty = summarize(np.full(5, NAN), 8)
    assert (empty.count, empty.rank_error, empty.mean) == (0, 0.0, 0.0)
    assert percentiles(empty, np.array([1.0, NAN], dtype=np.float32)).tolist() == [1.0, 1.0]
    one = merge([empty, summarize(np.array([2.0, 4.0], dtype=np.float32), 8)])
    assert one.mean == 3.0 and percentiles(one, np.array([2.0, 4.0, 3.0], dtype=np.float32)).tolist() == [
        0.25,
        0.75,
        0.5,
    ]
    with pytest.raises(ValueError, match="knots must be >= 1"):
        summarize(np.ones(3, dtype=np.float32), 0)


@pytest.mark.parametrize("policy", ["percentile", "below_mean"])
def test_keep_priorities_from_a_summary_match_the_exact_ones_where_it_is_exact(policy):
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 20, size=900).astype(np.float32)
    scores[::11] = NAN
    parts = split(scores, 3)
    summary = merge([summarize(p, 32) for p in parts])
    exact = keep_priorities(scores, policy, 2.0, 0.05, 0.4)
    for r, part in enumerate(parts):
        np.testing.assert_allclose(
            keep_priorities(part, policy, 2.0, 0.05, 0.4, summary=summary), exact[r::3], atol=1e-6
        )


@pytest.mark.slow
def test_every_rank_of_a_gloo_group_gets_the_merged_summary_of_all_parts(tmp_path):
    runs = torchrun.results(torchrun.launch(WORKER, tmp_path, 3), 3)
    scores = worker_scores(3)
    expected = merge([summarize(p, 16) for p in scores])
    for r in runs:
        assert r["values"] == expected.values.tolist() and r["weights"] == expected.weights.tolist()
        assert (r["count"], r["uncertain"]) == (expected.count, expected.uncertain)
        assert r["total"] == pytest.approx(expected.total)
        assert r["bytes"] == (16 + 2) * 2 * 8 * 3  # (knots + 2) rows of two float64 from each rank


def worker_scores(world: int) -> list[np.ndarray]:
    """Each rank's part in quantiles_worker.py: a size and distribution of its own, NaNs included."""
    out = []
    for r in range(world):
        rng = np.random.default_rng(100 + r)
        s = (rng.standard_normal(300 + 50 * r) * (r + 1)).astype(np.float32)
        s[:: 7 + r] = NAN
        out.append(s)
    return out


WORKER = worker("quantiles_worker.py")
