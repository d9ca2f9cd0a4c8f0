"""Moved to ``neuron_sift.epoch.scores.sharded`` (0.8.0), now ``neuron_sift.epoch.planning.sharded_planner``
(0.9.0); this path is removed in 0.9.0."""

from neuron_sift.shared.moved import moved_module

__getattr__ = moved_module(__name__, "neuron_sift.epoch.planning.sharded_planner", remove_in="0.9.0")
