"""Deprecated (for one release): renamed ``neuron_sift.dataloader.batch_counts`` (it counts
batches; the epoch mode's planner picks samples)."""

import warnings

from neuron_sift.dataloader.batch_counts import check_yields_a_batch, plan_epochs, source_batch_sizes

__all__ = ["check_yields_a_batch", "plan_epochs", "source_batch_sizes"]

warnings.warn(
    "neuron_sift.dataloader.planning is renamed neuron_sift.dataloader.batch_counts; the old name will be removed",
    DeprecationWarning,
    stacklevel=2,
)
