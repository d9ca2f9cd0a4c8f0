"""``EpochSiftConfig``: the validated settings of epoch-level sifting (``EpochSiftingDataloader``).

Like the other configs it is a dataclass that validates at construction and accepts a
dict (``EpochSiftConfig.from_dict`` or anywhere a config is expected), failing with
``SiftConfigValidationException`` naming the key.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_sift.shared.validation import check_int, check_real, coerce, fail, from_mapping

EPOCH_POLICIES = ("percentile", "below_mean")
SCORE_TABLES = ("replicated", "sharded")

_OWNER = "EpochSiftConfig"


def _check_real(key: str, value: Any, low: float, high: float, **bounds: bool) -> float:
    return check_real(_OWNER, key, value, low, high, **bounds)


@dataclass
class EpochSiftConfig:
    """Which samples each epoch trains on, planned at the epoch's start from recorded losses.

    A sample's *score* is its most recent training loss recorded by ``weighted_loss``.
    Each epoch, sample ``i`` is kept with probability ``p_i`` and its loss weighted by
    ``1 / p_i``, so the expected weighted loss of the epoch equals the full-data loss.

    ``policy``:

    * ``"percentile"`` (default): ``p = max(min_keep_probability, percentile ** beta_value)``,
      the percentile of the sample's score among all recorded scores (ties count half).
      Expected kept share ``f ** (1 + 1/beta) + (1 - f ** (1 + 1/beta)) / (1 + beta)`` for
      floor ``f`` (0.50 at beta 1, floor 0.05; 0.34 at beta 2).
    * ``"below_mean"``: InfoBatch's published rule: a sample whose score is below the mean
      score is kept with probability ``1 - prune_ratio``, weight ``1 / (1 - prune_ratio)``;
      the others are kept with weight 1. Expected kept share ``1 - prune_ratio * q``, where
      ``q`` is the share of scores below their mean (more than half when the losses are
      skewed right, as training losses usually are: a few large ones lift the mean).

    ``kept_share`` (the budget form, either policy; None: off): every sifted epoch keeps
    exactly ``k`` of the ``M`` samples the source's sampler yields (the dataset's ``N``
    unless a sampler restricts it): ``kept_share * M`` rounded half up
    (``floor(kept_share * M + 0.5)``, so 0.5 becomes 1 where Python's ``round`` gives 0),
    then down to a multiple of the ``W`` data-parallel ranks (equal shares), and at least
    one sample per rank. A budget of 0.01 on 50 samples keeps 1 (a share of 0.02); 0.5 of
    45 keeps 23; at 4 ranks, 20. With ``drop_last`` each rank trains its share cut to whole
    batches. The loader logs a warning when the share trained differs from ``kept_share``
    by more than a fifth of it (when it is built, from the budget's rounding; and for every
    sifted epoch that trains less than four fifths of it), and refuses a budget that leaves a rank less than one whole
    batch with ``drop_last``. The policy's probabilities are scaled by one common factor
    (capped at 1) so they sum to ``k``, and the kept set is drawn with exactly those
    probabilities (systematic sampling), so ``len()`` and the whole schedule length are
    exact. Without a budget the kept count is the expected count ``sum(p)`` rounded to
    whole batches (the probabilities scaled by the same small factor), so no sifted epoch
    ends with a short batch.

    ``warmup_epochs`` (default 1): the first epochs train on every sample, unit weights
    (they record the first scores). ``anneal_fraction`` (default 0.125): the last
    ``floor(anneal_fraction * num_epochs)`` epochs train on every sample with unit weights
    (needs the loader's ``num_epochs``). Samples never scored are always kept, weight 1.

    ``max_weight`` (None: off): clip every weight at this value. Clipping makes the
    weighted loss biased (low) wherever ``1 / p > max_weight``; off by default.

    ``seed`` (None: the source DataLoader's generator seed if it has one, else
    ``torch.initial_seed()`` when the loader is built): seeds each epoch's order and draws.

    ``noise_guard_epochs`` (0: off), ``noise_guard_quantile`` (default 0.8): the label-noise
    guard. A sample whose score was above the ``noise_guard_quantile`` of all scores (the
    lowest score with at least that share of the scores at or below it; a tie with it, such
    as the many exact 0.0 losses of a trained classifier, is not above it) in each of the
    last ``noise_guard_epochs`` epochs in which it was trained is treated as likely
    mislabeled and left out of sifted epochs while its score stays above that quantile
    (warm-up and annealing epochs still train on it): at most ``1 - noise_guard_quantile``
    of the scored samples are left out in any epoch. A budgeted sifted epoch that trains
    less than four fifths of its budget, for this or any other reason, is logged as a
    warning. This deliberately changes the objective (those samples no longer count) and is
    not unbiased for them; see the docs' Epoch-level sifting page (Label noise: the guard).

    ``start_rank_correlation`` (default 0.5; None: off): the start rule. A sifted epoch prunes
    only when the scores carry information: when the Spearman rank correlation between the
    scores of the samples the last epoch trained, before it and after it, is at least this;
    otherwise it trains every sample (kind ``held``, recorded with the correlation in the
    history and ``metrics()``). The first epoch with scores to plan from has nothing to
    compare them with and always trains every sample, so pruning starts at the third epoch
    at the earliest. With the rule on, how many samples a sifted epoch trains is known only
    when it opens: ``len()`` and ``planned_steps()`` count later sifted epochs as pruning
    (``length_is_exact`` is False); see the docs' Epoch-level sifting page (The start rule).

    ``max_pruned_share`` (None: off; instead of ``kept_share``): the automatic budget, for
    schedules of any length. A sifted epoch with ``p`` sifted epochs left (itself included)
    keeps ``1 - max_pruned_share * p / (p + 1)`` of the samples: the last one prunes half of
    ``max_pruned_share``, a long schedule's early ones nearly all of it, so a short fine-tune
    prunes less than a long run (a sample left out of an epoch has fewer epochs left to come
    back in). Counts are exact per epoch, as with ``kept_share``.

    ``score_smoothing`` (None: off): a sample's score is the moving average of its training
    losses, each new loss weighted ``score_smoothing`` (in (0, 1]; 1 is the last loss, as
    without it): a score less tied to the one epoch it was last trained in.
    ``weighted_batch_loss`` (losses with no per-sample value) averages with it too, 0.5 when
    it is None.

    ``score_table`` (default ``"replicated"``): where the scores live under data parallelism.
    ``"replicated"``: every rank holds all ``N`` scores and the whole plan, the ranks merge
    their tables once per epoch and plan exactly (one sort of all scores). ``"sharded"``: rank
    ``r`` of ``W`` owns the samples at positions ``r, r + W, ...`` of the sampler's samples,
    holds only their scores, trains only them, and plans its own equal share of each epoch
    from a merged summary of every rank's scores (``neuron_sift/epoch/planning/sharded_planner.py``: memory
    ``O(N / W)`` per rank, collectives independent of ``N``, percentiles within the summary's
    stated rank error). For datasets too large to hold one float per sample on every rank.

    Raises:
        SiftConfigValidationException: a field is missing, unknown (in a dict), of the
            wrong type or out of range; the message names the key.
    """

    policy: str = "percentile"
    beta_value: float = 1.0
    min_keep_probability: float = 0.05
    prune_ratio: float = 0.5
    kept_share: float | None = None
    warmup_epochs: int = 1
    anneal_fraction: float = 0.125
    max_weight: float | None = None
    seed: int | None = None
    noise_guard_epochs: int = 0
    noise_guard_quantile: float = 0.8
    score_table: str = "replicated"
    start_rank_correlation: float | None = 0.5
    score_smoothing: float | None = None
    max_pruned_share: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str) or self.policy not in EPOCH_POLICIES:
            fail(_OWNER, "policy", f"expected one of {EPOCH_POLICIES}, got {self.policy!r}")
        if not isinstance(self.score_table, str) or self.score_table not in SCORE_TABLES:
            fail(_OWNER, "score_table", f"expected one of {SCORE_TABLES}, got {self.score_table!r}")
        self.beta_value = _check_real("beta_value", self.beta_value, 0.0, math.inf, low_open=True, high_open=True)
        self.min_keep_probability = _check_real(
            "min_keep_probability", self.min_keep_probability, 0.0, 1.0, low_open=True
        )
        self.prune_ratio = _check_real("prune_ratio", self.prune_ratio, 0.0, 1.0, high_open=True)
        if self.kept_share is not None:
            self.kept_share = _check_real("kept_share", self.kept_share, 0.0, 1.0, low_open=True)
        check_int(_OWNER, "warmup_epochs", self.warmup_epochs, 0)
        self.warmup_epochs = int(self.warmup_epochs)
        self.anneal_fraction = _check_real("anneal_fraction", self.anneal_fraction, 0.0, 1.0)
        if self.max_weight is not None:
            self.max_weight = _check_real("max_weight", self.max_weight, 1.0, math.inf, high_open=True)
        if self.seed is not None:
            check_int(_OWNER, "seed", self.seed, 0)
            self.seed = int(self.seed)
        check_int(_OWNER, "noise_guard_epochs", self.noise_guard_epochs, 0)
        self.noise_guard_epochs = int(self.noise_guard_epochs)
        self.noise_guard_quantile = _check_real(
            "noise_guard_quantile", self.noise_guard_quantile, 0.0, 1.0, low_open=True, high_open=True
        )
        if self.max_pruned_share is not None:
            self.max_pruned_share = _check_real(
                "max_pruned_share", self.max_pruned_share, 0.0, 1.0, low_open=True, high_open=True
            )
            if self.kept_share is not None:
                fail(_OWNER, "max_pruned_share", "sets the budget automatically: give it or kept_share, not both")
        if self.score_smoothing is not None:
            self.score_smoothing = _check_real("score_smoothing", self.score_smoothing, 0.0, 1.0, low_open=True)
        if self.start_rank_correlation is not None:
            self.start_rank_correlation = _check_real(
                "start_rank_correlation", self.start_rank_correlation, -1.0, 1.0, low_open=True
            )

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> "EpochSiftConfig":
        return from_mapping(cls, _OWNER, value)

    @property
    def has_budget(self) -> bool:
        """Whether sifted epochs keep an exact count: ``kept_share`` or ``max_pruned_share``."""
        return self.kept_share is not None or self.max_pruned_share is not None

    def budget_share(self, sifted_left: int | None) -> float | None:
        """The share a budgeted sifted epoch keeps: ``kept_share``, or the automatic one with
        ``sifted_left`` sifted epochs left, itself included (None: an unbounded run); None
        without a budget."""
        if self.kept_share is not None:
            return self.kept_share
        if self.max_pruned_share is None:
            return None
        if sifted_left is None:
            return 1.0 - self.max_pruned_share
        return 1.0 - self.max_pruned_share * sifted_left / (sifted_left + 1)

    def expected_kept_share(self) -> float | None:
        """The expected kept share of a sifted epoch, where it does not depend on the scores.

        The budget; or, for ``percentile``, ``E[max(f, U ** beta)]`` for percentiles ``U``
        uniform on (0, 1); None for ``below_mean`` (it depends on how the scores are
        distributed around their mean).
        """
        if self.kept_share is not None:
            return self.kept_share
        if self.policy == "percentile":
            return percentile_expected_share(self.beta_value, self.min_keep_probability)
        return None

    def anneal_epochs(self, num_epochs: int | None) -> int:
        """How many of the last epochs train on all data: ``floor(anneal_fraction * num_epochs)``."""
        if num_epochs is None:
            return 0
        return int(math.floor(self.anneal_fraction * num_epochs + 1e-9))


def percentile_expected_share(beta_value: float, min_keep_probability: float) -> float:
    """``E[max(f, U ** beta)]`` for percentiles ``U`` uniform on (0, 1) and floor ``f``: the
    percentile policy's expected kept share (the policy's entry, ``epoch/selection/policies.py``,
    and ``expected_kept_share`` both read it here)."""
    f, b = min_keep_probability, beta_value
    cut = f ** (1.0 / b)  # percentiles below `cut` sit on the floor
    return f * cut + (1.0 - cut ** (b + 1.0)) / (b + 1.0)


def coerce_epoch_config(value: Any) -> EpochSiftConfig:
    """Accept an ``EpochSiftConfig`` or an equivalent dict."""
    return coerce(EpochSiftConfig, value)
