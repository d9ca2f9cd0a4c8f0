"""The run's identity: what a planner's state names and a checkpoint must agree on, made once
from the run's ``PlanSettings`` (the score table's kind is its config's ``score_table``).

Why one object: the planner writes it into every checkpoint (``EpochPlanner.state_dict``),
the planner's state check compares a checkpoint's with this loader's
(``planning/planner_state.py``), and the resume from every rank's states compares theirs
with each other (``resuming/run_states.py``). Written once, the three read the same names,
and what an older state's missing key means is stated once (``ABSENT``).

The layout kept: the seed and the settings in this order; ``max_pruned_share`` and
``reference`` always (states written before they existed lack them: None), the support
(``support_size``, ``support_crc32``) only when the user's sampler yields part of the
dataset and the table's kind only when it is not ``replicated`` (``SPARSE``), so states of
runs over every sample under a replicated table keep the layout they had before these
existed.
"""

from dataclasses import asdict, dataclass, fields
from typing import Any

from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.user_data.sampling import support_checksum

# Keys every planner state has held (version 1 on): a state without one is refused.
REQUIRED = ("seed", "n", "batch_size", "world_size", "rank", "policy", "kept_share")
# What a key means where a state lacks it (the keys added since version 1).
ABSENT: dict[str, Any] = {
    "max_pruned_share": None,
    "reference": None,
    "support_size": None,
    "support_crc32": None,
    "score_table": "replicated",
}
# Keys written only where they differ from what their absence means.
SPARSE = ("support_size", "support_crc32", "score_table")
# Keys a state's check compares apart, with a message of their own.
SUPPORT = ("support_size", "support_crc32")
# One rank's place in the run: every other key is the same on every rank of one run.
RANK_LAYOUT = ("world_size", "rank")


@dataclass(frozen=True)
class RunIdentity:
    """The planner state's fields: the plans' ``seed``, ``n`` dataset samples, ``batch_size``
    per rank, the rank layout (``world_size``, ``rank``), the config's ``policy``,
    ``kept_share`` and ``max_pruned_share``, the reference table's identity (``reference``),
    the support's size and CRC-32 (None: every sample) and the score table's kind."""

    seed: int
    n: int
    batch_size: int
    world_size: int
    rank: int
    policy: str
    kept_share: float | None
    max_pruned_share: float | None
    reference: str | None
    support_size: int | None
    support_crc32: int | None
    score_table: str

    @classmethod
    def of(cls, settings: PlanSettings) -> "RunIdentity":
        """The identity of the run ``settings`` plan (the support's checksum computed here, once)."""
        config, support = settings.config, settings.support
        return cls(
            seed=settings.seed,
            n=settings.n,
            batch_size=settings.batch_size,
            world_size=settings.world_size,
            rank=settings.rank,
            policy=config.policy,
            kept_share=config.kept_share,
            max_pruned_share=config.max_pruned_share,
            reference=settings.reference,
            support_size=None if support is None else int(support.shape[0]),
            support_crc32=support_checksum(support),
            score_table=config.score_table,
        )

    def as_dict(self) -> dict[str, Any]:
        """The planner's state: every field by name, in order, the sparse ones only where set."""
        return {key: value for key, value in asdict(self).items() if key not in SPARSE or value != ABSENT[key]}


# The keys every rank's state of one run holds alike, compared between the states of a resume
# from every rank's (the reference is compared by each rank's own state check).
RUN_WIDE = tuple(f.name for f in fields(RunIdentity) if f.name not in (*RANK_LAYOUT, "reference"))


def stated(state: Any, key: str) -> Any:
    """``key``'s value in a planner state, or what its absence means."""
    return state.get(key, ABSENT.get(key))
