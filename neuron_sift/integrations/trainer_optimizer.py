"""Moved to ``neuron_sift.integrations.hf_trainer.optimizer`` (0.9.0); this path is removed in 0.10.0."""

from neuron_sift.shared.moved import moved_module

__getattr__ = moved_module(__name__, "neuron_sift.integrations.hf_trainer.optimizer", remove_in="0.10.0")
