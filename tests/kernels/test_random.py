"""uniform_from_counter: open-interval range, determinism, distinct streams, uniformity.

The statistical bounds use fixed seeds (deterministic) with thresholds at tail
probabilities of about 1e-4 for a true uniform source, so a correct generator passes
with a wide margin while a biased or correlated one fails.
"""

import math

import numpy as np
import pytest
import torch

from neuron_sift.kernels import uniform_from_counter

STEP = 2.0**-23  # documented grid: (j + 0.5) * 2**-23


def draw(seed, counter, n):
    return uniform_from_counter(torch.tensor(seed, dtype=torch.int64), torch.tensor(counter, dtype=torch.int64), n)


def draws_over_counters(seed, counters, n):
    """Row-wise stack of ``draw(seed, c, n)`` for each counter (vmapped: the kernel sees scalars)."""
    return torch.vmap(lambda c: uniform_from_counter(torch.tensor(seed), c, n))(counters)


def draws_over_seeds(seeds, counter, n):
    return torch.vmap(lambda s: uniform_from_counter(s, torch.tensor(counter), n))(seeds)


def chi_square_critical(df, z=3.719):
    """Wilson-Hilferty upper quantile of chi-square(df); z=3.719 is the 1e-4 normal tail."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi_square(u, bins=64):
    counts = np.bincount(np.floor(np.asarray(u, dtype=np.float64) * bins).astype(np.int64), minlength=bins)
    assert len(counts) == bins  # no value reached 1.0
    expected = len(u) / bins
    return float(((counts - expected) ** 2 / expected).sum())


def ks_statistic(u):
    x = np.sort(np.asarray(u, dtype=np.float64))
    n = len(x)
    i = np.arange(1, n + 1)
    return max(float(np.max(i / n - x)), float(np.max(x - (i - 1) / n)))


@pytest.mark.parametrize("n", [1, 5, 64, 100, 4096])
@pytest.mark.parametrize(
    "seed,counter", [(0, 0), (1, 0), (0, 1), (12345, 678), (2**31 - 2, 2**31 - 1), (2**40 + 3, 2**45 + 7)]
)
def test_shape_dtype_and_open_interval(n, seed, counter):
    u = draw(seed, counter, n)
    assert u.shape == (n,)
    assert u.dtype == torch.float32
    assert bool((u > 0).all()) and bool((u < 1).all())
    # Half-step-offset multiples of the grid: never exactly 0 or 1, and log(-log(u)) is finite.
    scaled = u.double() / STEP - 0.5
    assert torch.equal(scaled, scaled.round())
    assert bool(torch.isfinite(torch.log(-torch.log(u))).all())


def test_largest_hash_value_is_still_below_one():
    # Regression: row 1604181 of (seed 0, counter 27) hashes to the top of the range; with a
    # 24-bit grid, (2**24 - 1) + 0.5 rounded to 2**24 in float32 and the draw was exactly 1.0
    # (then u < p fails for p == 1, and -log(-log(u)) is +inf).
    u = draw(0, 27, 1604182)
    assert float(u[-1]) == 1.0 - 0.5 * STEP
    assert float(u.max()) < 1.0


def test_same_seed_and_counter_give_same_values():
    a = draw(42, 7, 1000)
    b = draw(42, 7, 1000)
    assert torch.equal(a, b)
    # Not affected by the global torch RNG.
    torch.manual_seed(123)
    torch.rand(10)
    assert torch.equal(a, draw(42, 7, 1000))


def test_scalar_dtype_does_not_matter():
    seed32 = torch.tensor(42, dtype=torch.int32)
    counter32 = torch.tensor(7, dtype=torch.int32)
    assert torch.equal(uniform_from_counter(seed32, counter32, 100), draw(42, 7, 100))


def test_different_counters_give_different_streams():
    u = draws_over_counters(5, torch.arange(200), 64)  # [200, 64]
    for i in range(200):
        # Each other stream shares at most a stray value (collision chance 2**-24 per value).
        same = (u == u[i]).sum(dim=1)
        same[i] = 0
        assert int(same.max()) <= 1, i


def test_different_seeds_give_different_streams():
    u = draws_over_seeds(torch.arange(200), 0, 64)
    for i in range(200):
        same = (u == u[i]).sum(dim=1)
        same[i] = 0
        assert int(same.max()) <= 1, i
    # Seed and counter are not interchangeable.
    assert not torch.equal(draw(1, 2, 64), draw(2, 1, 64))


def _check_uniform(u):
    u = np.asarray(u, dtype=np.float64)
    n = len(u)
    se_mean = math.sqrt(1.0 / 12.0 / n)
    assert abs(u.mean() - 0.5) < 4.5 * se_mean
    # Var of (U - 1/2)^2 is 1/80 - 1/144 = 1/180.
    assert abs(u.var() - 1.0 / 12.0) < 4.5 * math.sqrt(1.0 / 180.0 / n)
    assert chi_square(u) < chi_square_critical(63)
    assert ks_statistic(u) < 2.15 / math.sqrt(n)  # Kolmogorov tail ~ 1e-4


@pytest.mark.parametrize("seed,counter", [(0, 0), (99, 12345)])
def test_uniform_along_rows_of_one_draw(seed, counter):
    _check_uniform(draw(seed, counter, 50_000).numpy())


def test_uniform_across_counters_for_a_fixed_row():
    # The engine draws row i of successive counters: each row must be uniform over time.
    u = draws_over_counters(11, torch.arange(50_000), 3).numpy()
    for row in range(3):
        _check_uniform(u[:, row])


def test_uniform_across_seeds_for_a_fixed_row():
    u = draws_over_seeds(torch.arange(50_000), 0, 2).numpy()
    _check_uniform(u[:, 0])
    _check_uniform(u[:, 1])


def test_no_correlation_between_neighbours():
    n = 50_000
    u = draws_over_counters(2024, torch.arange(n), 2).numpy().astype(np.float64)
    bound = 4.5 / math.sqrt(n)
    # Neighbouring rows of one draw, and the same row of consecutive counters.
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < bound
    assert abs(np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]) < bound
    row = draw(2024, 0, n).numpy().astype(np.float64)
    assert abs(np.corrcoef(row[:-1], row[1:])[0, 1]) < bound


def test_pairs_fill_the_unit_square_evenly():
    # Serial test on consecutive pairs of one stream: 8x8 cells, chi-square with 63 d.o.f.
    u = draw(77, 3, 100_000).numpy()
    x, y = u[0::2], u[1::2]
    cells = np.floor(x.astype(np.float64) * 8).astype(np.int64) * 8 + np.floor(y.astype(np.float64) * 8).astype(
        np.int64
    )
    counts = np.bincount(cells, minlength=64)
    expected = len(x) / 64
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi_square_critical(63)


def test_hash_is_identical_when_integers_are_narrowed_to_int32():
    """Neuron's compiler narrows int64 to int32 by default (up to neuronx-cc 2.32): products
    then wrap. The hash masks every product to 31 bits, so the int32 result is the same."""
    from neuron_sift.kernels.random import _GOLDEN, _mix31

    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randint(0, 2**31 - 1, (100000,), generator=g), torch.tensor([0, 1, 2**31 - 1])])
    assert torch.equal(_mix31(x.to(torch.int32)).to(torch.int64), _mix31(x))
    # Sums past 2**31 (seed + golden, hash + row) wrap negative in int32; the mask restores them.
    s = x + _GOLDEN
    assert torch.equal(_mix31(s.to(torch.int32)).to(torch.int64), _mix31(s))
