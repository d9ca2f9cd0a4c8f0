"""Deprecated (for one release): the epoch mode's own metrics functions of 0.4.0, now thin
aliases of the one surface, ``neuron_sift.metrics`` (``collect_metrics``, ``log_metrics``,
``write_tensorboard``) and ``neuron_sift.metrics.lightning.TrainingMetricsRecorder``.
"""

import logging
import warnings
from typing import Any

from neuron_sift.metrics.sifting_metrics import (
    EpochSiftingMetrics,
    find_epoch_loader,
    log_metrics,
    write_tensorboard,
)
from neuron_sift.metrics.snapshots import EPOCH_SCALARS, epoch_snapshot

__all__ = [
    "EpochSiftingMetrics",
    "SCALARS",
    "epoch_metrics",
    "find_epoch_loader",
    "lightning_callback",
    "log_epoch_metrics",
    "write_epoch_tensorboard",
]

SCALARS = EPOCH_SCALARS


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"neuron_sift.metrics.epoch_metrics.{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)


def _snapshot(obj: Any) -> EpochSiftingMetrics:
    """0.4.0's reading: only an epoch loader (a per-batch one is an error here)."""
    loader = find_epoch_loader(obj)
    if loader is None:
        raise TypeError(f"no EpochSiftingDataloader found in {type(obj).__name__}")
    return epoch_snapshot(loader)


def epoch_metrics(obj: Any) -> EpochSiftingMetrics:
    """Deprecated: ``neuron_sift.metrics.collect_metrics``."""
    _deprecated("epoch_metrics", "neuron_sift.metrics.collect_metrics")
    return _snapshot(obj)


def log_epoch_metrics(obj: Any, level: int = logging.INFO) -> EpochSiftingMetrics:
    """Deprecated: ``neuron_sift.metrics.log_metrics``."""
    _deprecated("log_epoch_metrics", "neuron_sift.metrics.log_metrics")
    return log_metrics(_snapshot(obj), level=level)


def write_epoch_tensorboard(obj: Any, writer: Any, step: int, prefix: str = "epoch_sifting/") -> EpochSiftingMetrics:
    """Deprecated: ``neuron_sift.metrics.write_tensorboard``."""
    _deprecated("write_epoch_tensorboard", "neuron_sift.metrics.write_tensorboard")
    return write_tensorboard(_snapshot(obj), writer, step, prefix)


def lightning_callback(prefix: str = "epoch_sifting/", on_step: bool = False) -> Any:
    """Deprecated: ``neuron_sift.metrics.lightning.TrainingMetricsRecorder`` (which this
    returns, recording every step with ``on_step=True``). Imports lightning only when called."""
    _deprecated("lightning_callback", "neuron_sift.metrics.lightning.TrainingMetricsRecorder")
    from neuron_sift.metrics.lightning import TrainingMetricsRecorder

    return TrainingMetricsRecorder(prefix=prefix, log_every_n_steps=1 if on_step else None)
