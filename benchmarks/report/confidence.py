"""The paired statistics of the summary: the mean of per-seed differences and its 95%
confidence interval (Student t over seeds), without scipy.

Why paired: every arm of a seed starts from the same weights and data order as that
seed's ``full`` run, so most of the seed-to-seed spread cancels in the per-seed difference;
its mean and interval say whether an arm is below ``full`` beyond the seeds' noise, which
medians and ranges over a few seeds cannot.

Why not scipy: the suite must run where only torch and the task packages are installed.
The quantile is exact, not tabulated: for an integer ``df`` the Student t distribution has
a closed form as a finite sum (Abramowitz and Stegun 26.7.3 and 26.7.4), inverted here by
bisection.
"""

import math
import statistics
from collections.abc import Sequence


def t_two_sided_mass(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's T with ``df`` (integer >= 1) degrees of freedom.

    With ``theta = atan(t / sqrt(df))``: for even ``df``,
    ``sin(theta) * sum_{j=0}^{df/2-1} c_j cos(theta)^(2j)`` with ``c_0 = 1``,
    ``c_j = c_{j-1} (2j - 1) / (2j)``; for odd ``df``,
    ``(2 / pi) (theta + sin(theta) * sum_{j=0}^{(df-3)/2} d_j cos(theta)^(2j+1))`` with
    ``d_0 = 1``, ``d_j = d_{j-1} (2j) / (2j + 1)`` (the sum empty for ``df = 1``).
    """
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an int >= 1, got {df!r}")
    t = abs(t)
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for j in range(1, df // 2):
            term *= (2 * j - 1) / (2 * j) * c * c
            total += term
        return s * total
    term, total = c, 0.0
    for j in range((df - 1) // 2):
        if j:
            term *= (2 * j) / (2 * j + 1) * c * c
        total += term
    return 2.0 / math.pi * (theta + s * total)


def t_quantile(level: float, df: int) -> float:
    """The ``t`` with ``P(|T| <= t) = level`` (``level`` in (0, 1)): the two-sided quantile,
    ``t_{(1 + level) / 2, df}``; 4.303 for 95% at ``df = 2``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    lo, hi = 0.0, 1.0
    while t_two_sided_mass(hi, df) < level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_two_sided_mass(mid, df) < level:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_ci95(values: Sequence[float | None]) -> tuple[float | None, list[float] | None]:
    """(mean, [low, high]) of the values that are not None: the 95% Student t interval
    ``mean +- t_{0.975, n-1} * sd / sqrt(n)``, sd with ``n - 1``. The interval is None
    below two values (no spread to judge by); the mean is None only with no value."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return None, None
    mean = statistics.fmean(v)
    if len(v) < 2:
        return mean, None
    half = t_quantile(0.95, len(v) - 1) * statistics.stdev(v) / math.sqrt(len(v))
    return mean, [mean - half, mean + half]
