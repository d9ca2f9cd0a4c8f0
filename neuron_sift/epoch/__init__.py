"""Epoch-level sifting: plan each epoch from the losses training already computed.

Thin parts, one job each:

- ``policy``: scores -> keep probabilities -> inclusion probabilities -> loss weights (the
  pure functions the planner runs on the host);
- ``quantiles``: percentiles of all scores from mergeable per-part summaries, within a
  stated rank error (the sharded table's percentiles);
- ``draws``: a seed per epoch, systematic sampling;
- ``planner``: which samples each epoch trains on, in what order, on which rank, and every
  count derived from that (``len()``, ``planned_steps()``);
- ``sharded``, ``ownership``: the planner of a sharded score table (each rank plans the
  samples it owns) and the map from a rank's samples to its tables' slots;
- ``reshard``, ``reowning``, ``dealing``: every rank's state made into this rank's at
  another world size (replicated, then sharded tables), the rest of an epoch dealt out;
- ``opening``: the one point per epoch where scores reach the host, merge and become a plan;
- ``progress``: the per-epoch iterator, the epoch's position and look-ahead;
- ``tables``: the score and weight tables, where the backend keeps state;
- ``shares``: each rank's share of the scores and their merge;
- ``guard``: the label-noise guard's streaks;
- ``pairing``: losses paired with the sample ids of their batch, and the counts of pairs;
- ``history``: the record of planned epochs and the phase timings;
- ``report``: the ``metrics()`` snapshot over the parts;
- ``sampling``: the user's sampler read as the samples a plan may draw and their order;
- ``source``: the user's DataLoader rebuilt around the planned batch sampler;
- ``checkpoint``: the versioned composition of the parts' states;
- ``loader``: ``EpochSiftingDataloader``, the arguments, lengths and state API over the parts.
"""

from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.epoch.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.policy import keep_priorities, loss_weights, percentile_of_all, scale_to_count
from neuron_sift.epoch.quantiles import ScoreSummary, merge, percentiles, summarize, summarize_over_ranks
from neuron_sift.epoch.sharded import ShardedPlanner

__all__ = [
    "EpochPlan",
    "EpochPlanner",
    "EpochSiftingDataloader",
    "ScoreSummary",
    "ShardedPlanner",
    "keep_priorities",
    "loss_weights",
    "merge",
    "percentile_of_all",
    "percentiles",
    "scale_to_count",
    "summarize",
    "summarize_over_ranks",
]
