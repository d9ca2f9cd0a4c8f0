"""Moved to ``neuron_sift.dataloader.batch_counts`` (0.8.0: it counts batches; the epoch
mode's planner picks samples); this path is removed in 0.9.0."""

from neuron_sift.shared.moved import moved_module

__getattr__ = moved_module(__name__, "neuron_sift.dataloader.batch_counts", remove_in="0.9.0")
