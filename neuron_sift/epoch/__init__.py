"""Epoch-level sifting: plan each epoch from the losses training already computed.

- ``policy``: scores -> keep probabilities -> loss weights (pure tensor functions);
- ``planner``: which samples each epoch trains on, in what order, on which rank;
- ``tables``: the score and weight tables (host arrays on CPU, device tensors otherwise);
- ``pairing``: losses paired with the sample ids of their batch;
- ``source``: the user's DataLoader rebuilt around the planned batch sampler;
- ``loader``: ``EpochSiftingDataloader``, composing the above.
"""

from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.epoch.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.policy import keep_priorities, loss_weights, scale_to_count

__all__ = ["EpochPlan", "EpochPlanner", "EpochSiftingDataloader", "keep_priorities", "loss_weights", "scale_to_count"]
