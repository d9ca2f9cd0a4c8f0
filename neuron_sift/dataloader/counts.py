"""Moved to ``neuron_sift.dataloader.sifting_counts`` (0.8.0; apart from
``neuron_sift.shared.counts``, the counts' common base; ``SiftingCounts`` is also
``neuron_sift.SiftingCounts``); this path is removed in 0.9.0."""

from neuron_sift.shared.moved import moved_module

__getattr__ = moved_module(__name__, "neuron_sift.dataloader.sifting_counts", remove_in="0.9.0")
