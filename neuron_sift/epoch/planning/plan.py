"""An epoch's plan, what it trains over all ranks, and the settings every plan is made from.

Why apart from the planner: the plan is the value every part reads (the iterator, the
tables, the checkpoint, the resume at another world size), and the settings are what the
score-table registry builds each planner from; neither depends on how a plan is drawn.
"""

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from neuron_sift.sift_config.epoch_config import EpochSiftConfig


@dataclass(frozen=True)
class PlanSettings:
    """What every plan of a run is made from, the same on every rank but ``rank``:
    ``n`` dataset samples, ``batch_size`` per rank, ``drop_last``, the plans' ``seed``, the
    run's ``num_epochs`` (None: no annealing), ``world_size`` ranks and this ``rank``, the
    ``support`` (sorted unique dataset ids the user's sampler yields; None: all ``n``) and
    whether kept samples train in dataset order (``ordered``: a sequential sampler), and the
    reference table's identity (``reference``, None without one:
    ``selection/reference_scores.py``)."""

    config: EpochSiftConfig
    n: int
    batch_size: int
    drop_last: bool
    seed: int
    num_epochs: int | None = None
    world_size: int = 1
    rank: int = 0
    support: np.ndarray | None = None
    ordered: bool = False
    reference: str | None = None

    def __post_init__(self) -> None:
        m = self.n if self.support is None else int(self.support.shape[0])
        if m < self.world_size:
            what = "the dataset has" if self.support is None else "the sampler yields"
            raise ValueError(f"{what} {m} samples, fewer than the {self.world_size} ranks")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")

    def as_rank(self, world_size: int, rank: int) -> "PlanSettings":
        """These settings as rank ``rank`` of the same run at ``world_size`` has them."""
        return replace(self, world_size=world_size, rank=rank)


def full_kind(kind: str, hold: bool) -> str:
    """The kind of a plan that trains every sample: its epoch's own (warm-up, annealing), or,
    for a sifted epoch, ``held`` (the start rule) or ``sift-unscored`` (nothing scored yet)."""
    if kind != "sift":
        return kind
    return "held" if hold else "sift-unscored"


@dataclass(frozen=True)
class TrainedCounts:
    """What a plan trains over all ranks, as the history reports it whatever the score
    table: ``kept`` samples trained, ``planned`` samples drawn, and the mean and largest
    loss weight of the trained ones (``EpochPlanner.trained_counts``)."""

    kept: int
    planned: int
    mean_weight: float
    max_weight: float


@dataclass
class EpochPlan:
    """One epoch's plan. ``order``: the kept sample ids of all ranks, in training order
    (length a multiple of the world size); ``weights``: ``[N]`` float32 loss weight of each
    sample (``1 / pi`` for sifted epochs, 1 otherwise); ``inclusion``: ``[N]`` float32
    ``pi`` (1 in full epochs).

    Under a sharded score table (``sharded_planner.py``) a plan is one rank's: ``order`` holds only
    this rank's kept ids, ``weights`` is indexed by this rank's slots (``ownership.py``) and
    ``inclusion`` is None (the weights are ``1 / pi``; one array less per owned sample).

    A plan resumed at another world size (``resuming/replicated_reshard.py``,
    ``resuming/sharded_reshard.py``) also names the world size ``order`` was shared out for
    (``world_size``) and the ids some rank trained before the resume (``done``); the ranks
    then share out the rest (``EpochPlanner.rank_batches_of``).
    Both are None for a plan trained at the world size it was made for."""

    epoch: int
    kind: str
    order: torch.Tensor
    weights: torch.Tensor
    inclusion: torch.Tensor | None
    excluded: int = 0  # samples left out by the noise guard
    world_size: int | None = None
    done: torch.Tensor | None = None

    @property
    def kept(self) -> int:
        return int(self.order.shape[0])

    def state_dict(self) -> dict[str, Any]:
        """The plan as CPU tensors and plain values: a resumed run trains the rest of this very
        plan instead of re-planning from scores that have moved on since. The resume fields
        are written only when set, so a plan trained where it was made keeps its layout."""
        state = {
            "epoch": self.epoch,
            "kind": self.kind,
            "order": self.order.clone(),
            "weights": self.weights.clone(),
            "excluded": self.excluded,
        }
        if self.inclusion is not None:
            state["inclusion"] = self.inclusion.clone()
        if self.done is not None:
            state["world_size"] = self.world_size
            state["done"] = self.done.clone()
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "EpochPlan":
        done = state.get("done")
        inclusion = state.get("inclusion")
        return cls(
            int(state["epoch"]),
            str(state["kind"]),
            state["order"].clone(),
            state["weights"].clone(),
            None if inclusion is None else inclusion.clone(),
            int(state["excluded"]),
            None if done is None else int(state["world_size"]),
            None if done is None else done.clone(),
        )
