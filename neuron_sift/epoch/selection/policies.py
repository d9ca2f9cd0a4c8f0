"""The epoch policies, each an entry of one registry: built from the config, answering its
keep priorities (``priorities``) and the share of a sifted epoch it keeps in expectation
(``expected_share``).

Why a registry (as the score tables have, ``epoch/score_table.py``): the planners of both
tables ask one object what to keep instead of branching on the policy's name, so a new rule
is its config fields (``EpochSiftConfig``) and one entry here; nothing else changes. Each
entry's priorities are a pure function of the scores (and, under a sharded table, of the
merged summary of every rank's scores): the same on every rank, after any resume.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from neuron_sift.epoch.selection.policy import below_mean_priorities, percentile_priorities
from neuron_sift.epoch.selection.quantiles import ScoreSummary
from neuron_sift.sift_config.epoch_config import EPOCH_POLICIES, EpochSiftConfig, percentile_expected_share


class EpochPolicy(Protocol):
    """A rule from scores to keep priorities."""

    def priorities(self, scores: np.ndarray, summary: ScoreSummary | None = None) -> np.ndarray:
        """The keep probability of every sample before any budget, ``[N]`` float32 in
        ``[0, 1]``, 1 where never scored (NaN). ``summary``: the recorded scores are those it
        summarises (every rank's, of which ``scores`` is one part): percentiles and means are
        read off it. None: ``scores`` are all the scores."""
        ...

    def expected_share(self) -> float:
        """The share of the samples a sifted epoch keeps in expectation without a budget,
        where it does not depend on the scores; otherwise an estimate (say which in the
        entry's docstring)."""
        ...


@dataclass(frozen=True)
class Percentile:
    """``max(min_keep_probability, percentile ** beta_value)``: the default."""

    beta_value: float
    min_keep_probability: float

    def priorities(self, scores: np.ndarray, summary: ScoreSummary | None = None) -> np.ndarray:
        return percentile_priorities(scores, self.beta_value, self.min_keep_probability, summary)

    def expected_share(self) -> float:
        """Exact for percentiles uniform on (0, 1) (``EpochSiftConfig.expected_kept_share``)."""
        return percentile_expected_share(self.beta_value, self.min_keep_probability)


@dataclass(frozen=True)
class BelowMean:
    """InfoBatch's rule: ``1 - prune_ratio`` below the mean score, 1 at or above it."""

    prune_ratio: float

    def priorities(self, scores: np.ndarray, summary: ScoreSummary | None = None) -> np.ndarray:
        return below_mean_priorities(scores, self.prune_ratio, summary)

    def expected_share(self) -> float:
        """An estimate: ``1 - prune_ratio * q`` depends on the share ``q`` of scores below their
        mean, taken as a half (training losses skewed right put more than half below it)."""
        return 1.0 - 0.5 * self.prune_ratio


POLICY_REGISTRY: dict[str, Callable[[EpochSiftConfig], EpochPolicy]] = {
    "percentile": lambda c: Percentile(c.beta_value, c.min_keep_probability),
    "below_mean": lambda c: BelowMean(c.prune_ratio),
}
assert tuple(POLICY_REGISTRY) == EPOCH_POLICIES, "every policy the config admits has an entry, and no other"


def epoch_policy(config: EpochSiftConfig) -> EpochPolicy:
    """The entry of ``config.policy``, built from the config (which validated the name)."""
    return POLICY_REGISTRY[config.policy](config)


def policy_named(name: str, **settings: Any) -> EpochPolicy:
    """The entry ``name`` built from config fields given by name (``keep_priorities``' form);
    ``ValueError`` naming the registered ones for another name."""
    if name not in POLICY_REGISTRY:
        raise ValueError(f"unknown policy {name!r}; registered: {', '.join(POLICY_REGISTRY)}")
    return POLICY_REGISTRY[name](EpochSiftConfig(policy=name, **settings))


def keep_priorities(
    scores: np.ndarray,
    policy: str,
    beta_value: float = 1.0,
    min_keep_probability: float = 0.05,
    prune_ratio: float = 0.5,
    summary: ScoreSummary | None = None,
) -> np.ndarray:
    """The keep probability of every sample under the policy named ``policy`` (an entry of
    ``POLICY_REGISTRY``), before any budget: ``[N]`` float32, 1 where never scored.
    The policy's settings by name, as ``EpochSiftConfig`` holds them; ``summary``: see
    ``EpochPolicy.priorities``."""
    return policy_named(
        policy, beta_value=beta_value, min_keep_probability=min_keep_probability, prune_ratio=prune_ratio
    ).priorities(scores, summary)
