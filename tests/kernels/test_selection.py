"""Keep probabilities, the two draws and compaction, against plain Python references."""

import itertools
import math

import numpy as np
import pytest
import torch

from neuron_sift.kernels import (
    bernoulli_keep,
    compact_indices,
    gumbel_topk_indices,
    keep_log_probability,
    keep_probability,
    top_k_indices,
    uniform_from_counter,
)

BATCH_SIZES = (1, 5, 64)
DOCUMENTED_BETAS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 10.0, 100.0)


def _pcts(rng, n):
    """Percentiles as the engine makes them: multiples of 1/(2H), with 0, 1 and ties."""
    h = 7
    return (rng.integers(0, 2 * h + 1, size=n) / (2 * h)).astype(np.float32)


# -- keep_probability / keep_log_probability ----------------------------------------------


@pytest.mark.parametrize("b", BATCH_SIZES)
@pytest.mark.parametrize("beta", DOCUMENTED_BETAS)
def test_keep_probability_matches_pow(b, beta):
    rng = np.random.default_rng(b)
    pct = np.concatenate([_pcts(rng, b), rng.random(b).astype(np.float32), np.float32([0.0, 1.0])])
    got = keep_probability(torch.from_numpy(pct), torch.tensor(beta, dtype=torch.float32))
    want = torch.tensor([math.pow(float(x), beta) for x in pct], dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-30)
    assert float(got[-2]) == 0.0 and float(got[-1]) == 1.0


@pytest.mark.parametrize("beta", DOCUMENTED_BETAS)
def test_expected_keep_share_is_one_over_one_plus_beta(beta):
    # The documented kept share: with percentiles uniform on (0, 1), E[pct ** beta] = 1 / (1 + beta).
    n = 20_000
    pct = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    share = float(keep_probability(pct, torch.tensor(beta, dtype=torch.float64)).mean())
    assert share == pytest.approx(1.0 / (1.0 + beta), rel=2e-3)


@pytest.mark.parametrize("beta", DOCUMENTED_BETAS)
def test_keep_log_probability_matches_log_of_pow(beta):
    rng = np.random.default_rng(int(beta * 100))
    pct = np.concatenate([rng.random(64), [1.0, 0.5, 1e-6]]).astype(np.float32)
    pct = np.maximum(pct, np.float32(1e-6))
    got = keep_log_probability(torch.from_numpy(pct), torch.tensor(beta, dtype=torch.float32))
    want = torch.tensor([beta * math.log(float(x)) for x in pct], dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert float(got[-3]) == 0.0  # pct 1 -> log 1 = 0


def test_keep_log_probability_is_finite_and_ordered_where_pow_underflows():
    # beta = 100: pct ** beta underflows to 0 in float32 for all these, but log space keeps the order.
    pct = torch.tensor([0.0, 1e-9, 1e-3, 0.01, 0.3, 0.4])
    beta = torch.tensor(100.0)
    p = keep_probability(pct, beta)
    assert torch.equal(p[:5], torch.zeros(5))
    log_p = keep_log_probability(pct, beta)
    assert bool(torch.isfinite(log_p).all())
    assert bool((log_p[1:] > log_p[:-1]).all())
    # pct == 0 (loss below the whole history) stays finite but below any real percentile:
    # the smallest non-zero mid-rank percentile for a history of a million is 1 / (2 * 10**6).
    smallest = keep_log_probability(torch.tensor([0.5e-6]), beta)
    assert float(log_p[0]) < float(smallest[0])


# -- bernoulli_keep -----------------------------------------------------------------------


def reference_bernoulli(p, u, valid, force):
    return [bool(v and (uu < pp or f)) for pp, uu, v, f in zip(p, u, valid, force)]


@pytest.mark.parametrize("b", BATCH_SIZES)
def test_bernoulli_keep_matches_reference(b):
    rng = np.random.default_rng(b + 5)
    for _ in range(10):
        p = np.where(rng.random(b) < 0.2, rng.choice([0.0, 1.0], size=b), rng.random(b)).astype(np.float32)
        u = uniform_from_counter(torch.tensor(1), torch.tensor(int(rng.integers(1 << 30))), b).numpy()
        valid = rng.random(b) < 0.8
        force = rng.random(b) < 0.2
        got = bernoulli_keep(torch.from_numpy(p), torch.from_numpy(u), torch.from_numpy(valid), torch.from_numpy(force))
        assert got.dtype == torch.bool and got.shape == (b,)
        assert got.tolist() == reference_bernoulli(p.tolist(), u.tolist(), valid.tolist(), force.tolist())


def test_padding_never_kept_and_forced_always_kept():
    b = 64
    u = uniform_from_counter(torch.tensor(0), torch.tensor(0), b)
    valid = torch.arange(b) < 40
    force = torch.arange(b) % 3 == 0
    # p == 1 everywhere: every valid row is kept, no padding row is (even a forced one).
    keep = bernoulli_keep(torch.ones(b), u, valid, force)
    assert torch.equal(keep, valid)
    # p == 0 everywhere: only the valid forced rows are kept.
    keep = bernoulli_keep(torch.zeros(b), u, valid, force)
    assert torch.equal(keep, valid & force)


def test_bernoulli_keep_rate_matches_probability():
    n = 100_000
    u = uniform_from_counter(torch.tensor(3), torch.tensor(9), n)
    ones = torch.ones(n, dtype=torch.bool)
    zeros = torch.zeros(n, dtype=torch.bool)
    for p in (0.01, 0.25, 0.5, 0.9):
        rate = float(bernoulli_keep(torch.full((n,), p), u, ones, zeros).float().mean())
        assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n), p


# -- gumbel_topk_indices ------------------------------------------------------------------


def _gumbel_case(rng, b, seed):
    k = int(rng.integers(1, b + 1))
    n_valid = int(rng.integers(1, b + 1))
    n_take = int(rng.integers(0, min(k, n_valid) + 1))
    valid = np.arange(b) < n_valid
    n_force = int(rng.integers(0, n_take + 1))
    force = np.zeros(b, dtype=bool)
    force[rng.choice(b, size=n_force, replace=False)] = True
    log_p = np.log(np.maximum(rng.random(b), 1e-12)).astype(np.float32) * float(rng.choice([0.5, 1.0, 3.0]))
    u = uniform_from_counter(torch.tensor(seed), torch.tensor(int(rng.integers(1 << 30))), b).numpy()
    return k, n_take, valid, force, log_p, u


@pytest.mark.parametrize("b", BATCH_SIZES)
def test_gumbel_topk_structure(b):
    rng = np.random.default_rng(b * 7)
    for trial in range(30):
        k, n_take, valid, force, log_p, u = _gumbel_case(rng, b, trial)
        indices, taken = gumbel_topk_indices(
            torch.from_numpy(log_p),
            torch.from_numpy(u),
            torch.from_numpy(valid),
            torch.from_numpy(force),
            k,
            torch.tensor(n_take),
        )
        assert indices.shape == (k,) and taken.shape == (k,)
        assert taken.dtype == torch.bool
        idx = indices.tolist()
        # k distinct rows of the batch.
        assert len(set(idx)) == k and all(0 <= i < b for i in idx)
        # The first n_take are taken, the rest not; taken ones ascending (source order).
        assert taken.tolist() == [True] * n_take + [False] * (k - n_take)
        chosen = idx[:n_take]
        assert chosen == sorted(chosen)
        # Padding is never taken while there are enough valid rows; forced rows always are.
        assert all(valid[i] for i in chosen)
        forced_valid = {i for i in range(b) if force[i] and valid[i]}
        assert forced_valid <= set(chosen)
        # The chosen set is the top n_take of log_p + Gumbel noise (forced first, padding last).
        score = []
        for i in range(b):
            if not valid[i]:
                score.append(-math.inf)
            elif force[i]:
                score.append(math.inf)
            else:
                score.append(float(log_p[i]) - math.log(-math.log(float(u[i]))))
        order = sorted(range(b), key=lambda i: -score[i])
        if 0 < n_take < b and abs(score[order[n_take - 1]] - score[order[n_take]]) < 1e-4:
            continue  # a float32 near-tie at the cut: either answer is right
        assert set(chosen) == set(order[:n_take])


def test_gumbel_topk_short_batch_takes_only_valid_rows():
    # A short last batch: 3 valid rows of 8, k computed for the full batch, n_take for the short one.
    b, k = 8, 4
    valid = torch.arange(b) < 3
    for c in range(50):
        u = uniform_from_counter(torch.tensor(0), torch.tensor(c), b)
        indices, taken = gumbel_topk_indices(
            torch.zeros(b), u, valid, torch.zeros(b, dtype=torch.bool), k, torch.tensor(2)
        )
        chosen = indices[taken].tolist()
        assert len(chosen) == 2 and all(i < 3 for i in chosen) and chosen == sorted(chosen)


def test_gumbel_topk_all_rows():
    # k == n_take == B: everything valid is taken, in order.
    b = 5
    u = uniform_from_counter(torch.tensor(0), torch.tensor(0), b)
    indices, taken = gumbel_topk_indices(
        torch.randn(b), u, torch.ones(b, dtype=torch.bool), torch.zeros(b, dtype=torch.bool), b, torch.tensor(b)
    )
    assert indices.tolist() == list(range(b))
    assert bool(taken.all())


def exact_inclusion(weights, n):
    """P(row i among the first n draws) when drawing without replacement, each draw with
    probability proportional to the remaining weights; by enumerating every ordered draw."""
    b = len(weights)
    total = sum(weights)
    incl = [0.0] * b
    for seq in itertools.permutations(range(b), n):
        prob = 1.0
        remaining = total
        for i in seq:
            prob *= weights[i] / remaining
            remaining -= weights[i]
        for i in seq:
            incl[i] += prob
    return incl


def monte_carlo_inclusion(log_p, valid, force, k, n_take, draws, seed):
    b = log_p.shape[0]
    u = uniform_from_counter(torch.tensor(seed), torch.tensor(0), draws * b).view(draws, b)
    fn = torch.vmap(lambda uu: gumbel_topk_indices(log_p, uu, valid, force, k, torch.tensor(n_take)))
    indices, taken = fn(u)
    counts = torch.zeros(b, dtype=torch.float64)
    counts.index_add_(0, indices[taken], torch.ones(int(taken.sum()), dtype=torch.float64))
    return (counts / draws).tolist()


DRAWS = 25_000
TOL = 0.018  # > 5.5 standard errors (at most 0.0032) of a frequency at 25k draws


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gumbel_topk_inclusion_matches_weighted_sampling_without_replacement(k):
    weights = [0.1, 0.2, 0.3, 0.4, 1.0]
    b = len(weights)
    log_p = torch.log(torch.tensor(weights))
    got = monte_carlo_inclusion(
        log_p, torch.ones(b, dtype=torch.bool), torch.zeros(b, dtype=torch.bool), k, k, DRAWS, seed=k
    )
    want = exact_inclusion(weights, k)
    assert sum(got) == pytest.approx(k)
    for i in range(b):
        assert abs(got[i] - want[i]) < TOL, (i, got, want)


def test_gumbel_topk_inclusion_with_fewer_takes_than_k():
    # n_take < k: the taken rows are the first n_take weighted draws.
    weights = [0.05, 0.5, 0.25, 1.0, 0.7, 0.3]
    b = len(weights)
    got = monte_carlo_inclusion(
        torch.log(torch.tensor(weights)),
        torch.ones(b, dtype=torch.bool),
        torch.zeros(b, dtype=torch.bool),
        k=4,
        n_take=2,
        draws=DRAWS,
        seed=99,
    )
    want = exact_inclusion(weights, 2)
    for i in range(b):
        assert abs(got[i] - want[i]) < TOL, (i, got, want)


def test_gumbel_topk_inclusion_with_forced_and_padding_rows():
    # Row 1 is forced (always in), row 5 is padding (never in); the other picks follow the weights.
    weights = [0.2, 0.01, 0.6, 1.0, 0.4, 5.0]
    valid = torch.tensor([True, True, True, True, True, False])
    force = torch.tensor([False, True, False, False, False, False])
    got = monte_carlo_inclusion(torch.log(torch.tensor(weights)), valid, force, k=3, n_take=3, draws=DRAWS, seed=5)
    assert got[1] == 1.0
    assert got[5] == 0.0
    rest = [0, 2, 3, 4]
    want = exact_inclusion([weights[i] for i in rest], 2)
    for j, i in enumerate(rest):
        assert abs(got[i] - want[j]) < TOL, (i, got, want)


def test_gumbel_topk_with_keep_log_probability_weights_by_pct_pow_beta():
    # End to end through the log-space keep probability: weights pct ** beta.
    pct = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9])
    beta = 2.0
    log_p = keep_log_probability(pct, torch.tensor(beta))
    got = monte_carlo_inclusion(
        log_p, torch.ones(5, dtype=torch.bool), torch.zeros(5, dtype=torch.bool), 2, 2, DRAWS, seed=8
    )
    want = exact_inclusion([float(x) ** beta for x in pct.tolist()], 2)
    for i in range(5):
        assert abs(got[i] - want[i]) < TOL, (i, got, want)


# -- compact_indices ----------------------------------------------------------------------


@pytest.mark.parametrize("b", BATCH_SIZES)
def test_compact_indices_matches_nonzero_order(b):
    rng = np.random.default_rng(b + 11)
    masks = [np.zeros(b, dtype=bool), np.ones(b, dtype=bool)] + [rng.random(b) < s for s in (0.1, 0.5, 0.9)]
    for mask in masks:
        indices, count = compact_indices(torch.from_numpy(mask))
        kept = [i for i in range(b) if mask[i]]
        dropped = [i for i in range(b) if not mask[i]]
        assert indices.shape == (b,)
        assert count.shape == () and int(count) == len(kept)
        assert indices.tolist() == kept + dropped
        assert indices[: int(count)].tolist() == np.nonzero(mask)[0].tolist()


def _gumbel_by_sorting(log_p, u, valid, force, k, n_take):
    """The former formulation (sort of integer keys): the reference for the order of both parts."""
    b = log_p.shape[0]
    score = log_p - torch.log(-torch.log(u))
    score = torch.where(force, torch.full_like(score, float("inf")), score)
    score = torch.where(valid, score, torch.full_like(score, float("-inf")))
    top = torch.topk(score, k, sorted=True).indices
    taken = torch.arange(k) < n_take
    key = torch.sort(torch.where(taken, top, top + b)).values
    return torch.where(key < b, key, key - b), key < b


@pytest.mark.parametrize("b", BATCH_SIZES)
def test_gumbel_topk_order_equals_the_sorting_formulation(b):
    """Taken rows ascending, then untaken drawn rows ascending: exactly as sorting integer keys gave."""
    rng = np.random.default_rng(b * 13)
    for trial in range(30):
        k, n_take, valid, force, log_p, u = _gumbel_case(rng, b, trial)
        args = [torch.from_numpy(a) for a in (log_p, u, valid, force)]
        got = gumbel_topk_indices(*args, k, torch.tensor(n_take))
        want = _gumbel_by_sorting(*args, k, n_take)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("b", [1, 7, 32])
def test_top_k_takes_the_highest_scores_in_source_order(b):
    g = torch.Generator().manual_seed(b)
    for _ in range(20):
        score = torch.randn(b, generator=g)
        n_valid = int(torch.randint(1, b + 1, (1,), generator=g))
        valid = torch.arange(b) < n_valid
        force = valid & (torch.rand(b, generator=g) < 0.1)
        k = max(1, b // 2)
        n_take = min(k, n_valid)
        order, taken = top_k_indices(score, valid, force, k, torch.tensor(n_take))
        kept = order[taken]
        # the expected set: forced rows first, then the highest valid scores
        key = torch.where(force, torch.tensor(float("inf")), score)
        key = torch.where(valid, key, torch.tensor(float("-inf")))
        want = torch.sort(torch.topk(key, k).indices[:n_take]).values
        assert torch.equal(kept, want)
        assert kept.numel() == n_take and bool(valid[kept].all())
        others = torch.ones(b, dtype=torch.bool)
        others[kept] = False
        if (others & valid).any():
            assert float(key[kept].min()) >= float(key[others & valid].max())


def test_top_k_never_draws():
    """The same scores give the same rows whatever the uniforms: no randomness enters."""
    score = torch.tensor([0.3, 2.0, -1.0, 0.7, 1.5, 0.0])
    valid = torch.ones(6, dtype=torch.bool)
    order, taken = top_k_indices(score, valid, torch.zeros(6, dtype=torch.bool), 3, torch.tensor(3))
    assert order[taken].tolist() == [1, 3, 4]
