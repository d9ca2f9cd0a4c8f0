"""The epoch policy: scores -> keep probabilities -> loss weights. Pure tensor functions.

No state, no devices by name, no host reads: the same functions run on CPU tensors and
on XLA tensors (fixed shapes). The planner (``planner.py``) draws the kept set from the
probabilities; the loader applies the weights.

Why the weights make the loss unbiased (the derivation the README repeats): a sifted
epoch keeps sample ``i`` with probability ``pi_i > 0`` and weights its loss by
``1 / pi_i``. With ``K_i`` the indicator that ``i`` is kept (``E[K_i] = pi_i``), the
epoch's weighted loss ``L_w = (1/N) * sum_i K_i * l_i / pi_i`` has expectation
``(1/N) * sum_i pi_i * l_i / pi_i = (1/N) * sum_i l_i``: the full-data loss, for any
fixed scores and losses, whatever the joint distribution of the ``K_i`` (only the
marginals enter, so systematic sampling with a fixed kept count is as unbiased as
independent draws). Bias appears only where the weight is not ``1 / pi_i``: a sample
with ``pi_i = 0`` (the noise guard's excluded samples: deliberately out of the
objective) and a weight clipped by ``max_weight`` (``E`` then falls short by
``(1 - pi_i * max_weight) * l_i / N`` for each such sample).
"""

import torch

from neuron_sift.kernels.scores import percentile_of_all


def keep_priorities(
    scores: torch.Tensor,
    policy: str,
    beta_value: float = 1.0,
    min_keep_probability: float = 0.05,
    prune_ratio: float = 0.5,
    *,
    sort_method: str = "search",
) -> torch.Tensor:
    """The policy's keep probability of every sample, before any budget: ``[N]`` float32.

    ``scores``: ``[N]``, NaN where never scored (such a sample gets 1). ``sort_method``: how
    the percentile finds ranks, the backend's ``sort_method`` for the tensors' device
    (``"merge"`` on XLA, which cannot lower ``searchsorted``; ``"search"`` elsewhere): this
    function stays pure, so it does not ask what device it runs on.

    * ``percentile``: ``max(min_keep_probability, percentile ** beta_value)``, the
      percentile among all recorded scores with ties counting half;
    * ``below_mean``: ``1 - prune_ratio`` below the mean of the recorded scores, else 1.
    """
    seen = ~torch.isnan(scores)
    if policy == "percentile":
        pct = percentile_of_all(scores.to(torch.float32), method=sort_method)
        p = torch.clamp(pct.pow(beta_value), min=min_keep_probability, max=1.0)
    elif policy == "below_mean":
        s = torch.where(seen, scores, torch.zeros_like(scores)).to(torch.float64)
        n = torch.clamp(seen.sum(), min=1).to(torch.float64)
        mean = s.sum() / n
        below = seen & (s < mean)
        p = torch.where(below, torch.full_like(s, 1.0 - prune_ratio), torch.ones_like(s)).to(torch.float32)
    else:
        raise ValueError(f"unknown policy {policy!r}")
    return torch.where(seen, p, torch.ones_like(p))


def scale_to_count(priorities: torch.Tensor, count: torch.Tensor, forced: torch.Tensor | None = None) -> torch.Tensor:
    """Inclusion probabilities ``pi = min(1, c * p)`` summing to ``count`` (water-filling).

    ``priorities``: ``[N]`` in ``[0, 1]`` (0: never kept); ``count``: a scalar tensor, the
    number of samples to keep; ``forced``: ``[N]`` bool, samples kept for sure (``pi = 1``,
    taken out of the count first). One common factor ``c`` keeps the policy's relative
    preferences; samples that would exceed 1 are capped and the rest share what is left.
    Static shapes (one sort, suffix sums, an arg-min): runs on XLA too. If the count is at
    least the number of eligible samples, every eligible sample gets 1; if the forced
    samples alone exceed the count, they share it uniformly and the others get 0 (the
    caller's documented exception).
    """
    p = priorities.to(torch.float64)
    count = count.to(torch.float64)
    if forced is None:
        forced = torch.zeros_like(p, dtype=torch.bool)
    n_forced = forced.sum().to(torch.float64)
    free = torch.where(forced, torch.zeros_like(p), p)
    left = torch.clamp(count - n_forced, min=0.0)
    order = torch.sort(free, descending=True).values  # p_(0) >= p_(1) >= ...
    n = order.shape[0]
    # With the first j (largest) capped at 1: c_j = (left - j) / sum_{i >= j} p_(i).
    suffix = torch.flip(torch.cumsum(torch.flip(order, [0]), 0), [0])
    j = torch.arange(n, dtype=torch.float64, device=p.device)
    c = (left - j) / torch.clamp(suffix, min=1e-300)
    # The right j is the first whose largest uncapped item stays <= 1 under c_j.
    ok = (c * order <= 1.0 + 1e-12) & (suffix > 0)
    first = torch.argmax(ok.to(torch.int64))
    c_star = torch.where(ok.any(), c[first], torch.full_like(c[0], float("inf")))
    pi = torch.clamp(c_star * free, max=1.0)
    pi = torch.where(free > 0, pi, torch.zeros_like(pi))
    share = torch.clamp(count / torch.clamp(n_forced, min=1.0), max=1.0)  # forced exceed the count
    pi = torch.where(n_forced >= count, torch.zeros_like(pi), pi)
    return torch.where(forced, share.expand_as(pi), pi)


def loss_weights(inclusion: torch.Tensor, max_weight: float | None = None) -> torch.Tensor:
    """``1 / pi`` for every sample with ``pi > 0`` (1 elsewhere: such a sample is never
    trained on), optionally clipped at ``max_weight`` (biased where it clips). float32."""
    pi = inclusion.to(torch.float64)
    w = torch.where(pi > 0, 1.0 / torch.clamp(pi, min=1e-300), torch.ones_like(pi))
    if max_weight is not None:
        w = torch.clamp(w, max=max_weight)
    return w.to(torch.float32)
