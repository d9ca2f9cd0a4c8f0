"""Moved to ``neuron_sift.dataloader.loader_checkpoint`` (0.8.0; apart from the epoch mode's
checkpoint and ``neuron_sift.shared.checkpoints``, the envelope); this path is removed in 0.9.0."""

from neuron_sift.shared.moved import moved_module

__getattr__ = moved_module(__name__, "neuron_sift.dataloader.loader_checkpoint", remove_in="0.9.0")
