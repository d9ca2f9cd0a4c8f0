"""The epoch loader's reference table: what a plan ranks when the run has a reference model.

Why: the per-batch loader's excess loss (``criterion="excess"``) is RHO-LOSS's reducible
loss, the learner's loss minus a reference model's on the same sample; the epoch loader's
scores are the learner's training losses, so the same table gives it the same criterion
without a forward of its own. Three rules, one per situation:

- while no sample has a score (epoch 0 with ``warmup_epochs=0``, a single pass), the plan
  ranks minus the reference loss: the static filter, lowest reference losses likeliest kept;
- once scores exist, it ranks each scored sample's excess, its score minus its reference
  loss; a sample not yet scored is given the median excess of the scored ones (neither
  forced in nor left out, as an unscored sample without a reference would be forced), the
  median taken over every rank's scored samples (the merged summary under the sharded table);
- the start rule does not hold epochs: a reference ranks the samples from the start
  (``without_start_rule``).

The table's losses of this rank's entries are read once, on the host, and kept beside the
score table (the same size); every rank reads the same table (its identity is a plan
setting, checked on resume).
"""

import dataclasses
import logging
from typing import Any

import numpy as np
import torch

from neuron_sift.scoring.reference_table import ReferenceTable, as_reference_table
from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.sift_config.epoch_config import EpochSiftConfig

logger = logging.getLogger(EPOCH_LOGGER)


def reference_identity(table: ReferenceTable | None) -> str | None:
    """What a checkpoint records of the table (its size, scored ids and dataset's
    fingerprint): a resume with another table is refused."""
    if table is None:
        return None
    return f"n={table.n};ids={table.ids_sha256 or 'all'};fingerprint={table.fingerprint or 'none'}"


def without_start_rule(config: EpochSiftConfig, table: ReferenceTable | None) -> EpochSiftConfig:
    """The config a run with ``table`` plans with: the start rule off (logged when it was on)."""
    if table is None or config.start_rank_correlation is None:
        return config
    logger.info(
        "EpochSiftingDataloader: with a reference table the start rule is off (start_rank_correlation=%s "
        "ignored): the reference ranks the samples from the first sifted epoch",
        config.start_rank_correlation,
    )
    return dataclasses.replace(config, start_rank_correlation=None)


def load_reference(value: Any, config: EpochSiftConfig) -> tuple[ReferenceTable | None, EpochSiftConfig]:
    """The ``reference`` argument as a table, and the config to plan with. Its checks against
    the dataset come later (``ReferenceScores``): after every rank has agreed on the table's
    identity, so that ranks holding other tables are refused together, not one alone."""
    table = as_reference_table(value)
    return table, without_start_rule(config, table)


class ReferenceScores:
    """Turns the merged scores of a plan's table entries into what the plan ranks."""

    def __init__(self, table: ReferenceTable, planner: Any, dataset: Any) -> None:
        # The table belongs to the dataset (size, fingerprint) and covers every sample the
        # sampler yields (lookup names the first id without a loss).
        table.check_dataset(dataset, who="EpochSiftingDataloader")
        table.lookup(np.arange(planner.n, dtype=np.int64) if planner.support is None else planner.support)
        self.table = table
        self.planner = planner
        self._losses: torch.Tensor | None = None

    def losses(self, size: int) -> torch.Tensor:
        """The reference loss of each of this rank's ``size`` table entries (NaN: an entry no
        plan draws), read from the table once."""
        if self._losses is None or self._losses.shape[0] != size:
            ids = self.planner.entry_ids()
            out = torch.full((size,), float("nan"), dtype=torch.float32)
            out[torch.from_numpy(self.planner.slots(ids))] = self.table.lookup(ids)
            self._losses = out
        return self._losses

    def planning_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` (``[entries]`` CPU, NaN = unscored) as the plan ranks them."""
        reference = self.losses(int(scores.shape[0]))
        scores = scores.detach().cpu().to(torch.float32)
        drawn = ~torch.isnan(reference)
        scored = drawn & ~torch.isnan(scores)
        # Decided over every rank's entries (the sharded table holds a share on each): the same
        # rule, and the same fill, for every sample whichever rank owns it.
        count = self.planner.sum_over_ranks(torch.tensor([float(scored.sum())], dtype=torch.float64))
        if float(count[0]) == 0.0:
            return -reference
        excess = torch.where(scored, scores - reference, torch.full_like(scores, float("nan")))
        fill = self.planner.score_quantile(excess, 0.5)
        assert fill is not None  # some rank holds a scored entry
        return torch.where(drawn & ~scored, reference.new_tensor(fill), excess)
