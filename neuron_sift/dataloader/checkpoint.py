"""Deprecated (for one release): renamed ``neuron_sift.dataloader.loader_checkpoint`` (apart
from the epoch mode's checkpoint and ``neuron_sift.shared.checkpoints``, the envelope)."""

import warnings

from neuron_sift.dataloader.loader_checkpoint import (
    FORMAT,
    PARTS,
    epoch_in_progress,
    loader_state,
    restore_loader_state,
    upgrade_v1,
)

__all__ = ["FORMAT", "PARTS", "epoch_in_progress", "loader_state", "restore_loader_state", "upgrade_v1"]

warnings.warn(
    "neuron_sift.dataloader.checkpoint is renamed neuron_sift.dataloader.loader_checkpoint; the old name will be "
    "removed",
    DeprecationWarning,
    stacklevel=2,
)
