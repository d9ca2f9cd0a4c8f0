"""Moved to ``neuron_sift.scoring.forward`` (0.9.0); this path goes in a later release."""

from neuron_sift.shared.moved import moved_module

__getattr__ = moved_module(__name__, "neuron_sift.scoring.forward")
