"""Deprecated (for one release): renamed ``neuron_sift.dataloader.sifting_pass``, and its
``SiftingEpoch`` renamed ``SiftingPass`` (one pass over the source, beside the epoch mode's
``neuron_sift.epoch``)."""

import warnings

from neuron_sift.dataloader.sifting_pass import SiftingPass, SourceReader

__all__ = ["SiftingEpoch", "SiftingPass", "SourceReader"]

SiftingEpoch = SiftingPass

warnings.warn(
    "neuron_sift.dataloader.epoch_iterator is renamed neuron_sift.dataloader.sifting_pass, and its SiftingEpoch "
    "is renamed SiftingPass; the old names will be removed",
    DeprecationWarning,
    stacklevel=2,
)
