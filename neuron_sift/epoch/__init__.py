"""Epoch-level sifting: plan each epoch from the losses training already computed.

Rooms, each below the ones that use it (every import points down this list):

- ``loader``: ``EpochSiftingDataloader``, the arguments, lengths and state API over the parts;
- ``score_table``: the registry of score tables (replicated, sharded), the one place the
  config's ``score_table`` is read: each builds its planner and shares and resumes;
- ``resuming/``: the checkpoint's layout and versions, the checks every rank's states pass,
  and resuming at another world size (``replicated_reshard``, ``sharded_reshard``);
- ``running/``: one epoch: opening it, iterating it (``progress``), pairing losses with
  samples, the record of epochs (``history``) and the ``metrics()`` snapshot;
- ``scores/``: this rank's score and weight tensors (``tables``) and what it shares of
  them with the other ranks (``rank_shares`` replicated, ``owned_shares`` sharded);
- ``planning/``: the plan, its settings and the run's identity they make (``run_identity``),
  the replicated planner (every count, and the one planning sequence) and the sharded one
  (``sharded_planner``, with its map of samples to ranks and slots: ``ownership``), the
  checks of a state against the planner, dealing an epoch's rest out, the settings every
  rank must agree on;
- ``selection/``: scores -> keep priorities -> inclusion probabilities -> loss weights
  (``policy``), percentiles from mergeable summaries (``quantiles``), seeded draws, the
  label-noise guard;
- ``user_data/``: the user's sampler and DataLoader (Streaming's too), read and rebuilt
  around the planned batch sampler.
"""

from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.epoch.planning.plan import EpochPlan, PlanSettings
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from neuron_sift.epoch.selection.policies import keep_priorities
from neuron_sift.epoch.selection.policy import loss_weights, percentile_of_all, scale_to_count
from neuron_sift.epoch.selection.quantiles import ScoreSummary, merge, percentiles, summarize, summarize_over_ranks

__all__ = [
    "EpochPlan",
    "EpochPlanner",
    "EpochSiftingDataloader",
    "PlanSettings",
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
