"""The seeded draws every plan is made of (``neuron_sift.epoch.selection.draws``). What users
rely on: a sifted epoch keeps exactly its planned count, each sample with exactly its
planned probability (so the weights ``1 / pi`` are exact), in the seeded random order the
plan trains in; and the per-epoch seed is a fixed function of (seed, epoch), so a resumed
run, in this version or a later one, draws the epochs after the resume as the
uninterrupted run did."""

import numpy as np
import pytest

from neuron_sift.epoch.selection.draws import epoch_seed, systematic_sample

# 40 probabilities summing to 11: two always kept, two never, the rest in between.
PI = np.concatenate([[1.0, 1.0, 0.0, 0.0], np.linspace(0.05, 0.45, 36)])
K = 11


def test_systematic_sampling_has_the_planned_marginals():
    rng = np.random.default_rng(1)
    counts = np.zeros(PI.shape[0])
    trials = 4000
    for _ in range(trials):
        perm = rng.permutation(PI.shape[0])
        kept = systematic_sample(PI, perm, K, float(rng.random()))
        assert kept.shape[0] == len(set(kept.tolist())) == K  # exactly k, each once
        counts[kept] += 1
    freq = counts / trials
    se = np.sqrt(PI * (1 - PI) / trials)
    assert np.all(np.abs(freq - PI) <= 5 * se + 1e-12)  # pi 1: every time; pi 0: never


@pytest.mark.parametrize("u", [0.0, 0.37, 0.999999])
def test_the_kept_ids_come_in_the_order_of_the_permutation(u):
    perm = np.random.default_rng(2).permutation(PI.shape[0])
    kept = systematic_sample(PI, perm, K, u)
    where = [int(np.flatnonzero(perm == i)[0]) for i in kept]
    assert where == sorted(where)  # a subsequence of perm: the plan trains in its seeded order
    assert {0, 1} <= set(kept.tolist()) and not {2, 3} & set(kept.tolist())


def test_probabilities_that_do_not_sum_to_the_count_are_an_internal_error():
    with pytest.raises(AssertionError, match="internal error: inclusion probabilities sum to 11.0, not 12"):
        systematic_sample(PI, np.arange(PI.shape[0]), K + 1, 0.5)


def test_the_epoch_seed_is_a_fixed_non_negative_63_bit_function_of_seed_and_epoch():
    seeds = [epoch_seed(s, e) for s in (0, 1, 7, 2**62) for e in range(20)]
    assert len(set(seeds)) == len(seeds)  # a new draw for every epoch and every run seed
    assert all(0 <= s < 2**63 for s in seeds)
    # Pinned: another function would re-draw every epoch after a resume from an older version's checkpoint.
    assert [epoch_seed(0, 0), epoch_seed(0, 1), epoch_seed(7, 3)] == [
        8286242343226680935,
        3043605876323429014,
        8655840465400278221,
    ]
