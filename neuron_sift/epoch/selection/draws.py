"""The seeded draws every plan is made of: a seed per epoch, and systematic sampling.

Why systematic sampling: with inclusion probabilities ``pi`` summing to an integer ``k``,
the points ``u, u+1, ..., u+k-1`` (``u`` uniform in [0, 1)) fall into the cumulative sums
of ``pi`` taken in a seeded random order; the samples hit are kept. Each sample is kept
with probability exactly ``pi_i`` (its interval has length ``pi_i <= 1``) and exactly ``k``
are kept, so the weights ``1 / pi`` are exact and an epoch's length is known.
"""

import numpy as np

from neuron_sift.shared.logs import seed63


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed per (seed, epoch): splitmix64 of both."""
    x = (seed * 0x9E3779B97F4A7C15 + (epoch + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & ((1 << 64) - 1)
    x ^= x >> 31
    return seed63(x)


def systematic_sample(pi: np.ndarray, perm: np.ndarray, k: int, u: float) -> np.ndarray:
    """Ids kept by systematic sampling: exactly ``k`` (``sum(pi)`` must be ``k``), each with
    probability ``pi_i``, in the order of ``perm``."""
    edges = np.cumsum(pi[perm])
    total = float(edges[-1]) if edges.size else 0.0
    if abs(total - k) > 1e-6 * max(1.0, k):
        raise AssertionError(f"internal error: inclusion probabilities sum to {total}, not {k}")
    if total > 0:
        edges *= k / total  # exact sum k against rounding
    points = u + np.arange(k, dtype=np.float64)
    hit = np.minimum(np.searchsorted(edges, points, side="right"), perm.shape[0] - 1)
    return perm[hit].astype(np.int64)
