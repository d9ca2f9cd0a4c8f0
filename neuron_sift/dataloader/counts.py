"""Deprecated (for one release): renamed ``neuron_sift.dataloader.sifting_counts`` (apart from
``neuron_sift.shared.counts``, the counts' common base)."""

import warnings

from neuron_sift.dataloader.sifting_counts import SiftingCounts

__all__ = ["SiftingCounts"]

warnings.warn(
    "neuron_sift.dataloader.counts is renamed neuron_sift.dataloader.sifting_counts (SiftingCounts is also "
    "neuron_sift.SiftingCounts); the old name will be removed",
    DeprecationWarning,
    stacklevel=2,
)
