"""Sifting metrics of either mode: ``collect_metrics(obj)`` -> ``SiftingMetrics`` or
``EpochSiftingMetrics``, as log lines (``log_metrics``) or TensorBoard scalars
(``write_tensorboard``).

``neuron_sift.metrics.lightning.TrainingMetricsRecorder`` (smart_sifting's Lightning
callback) needs ``lightning`` and is imported from its own module; importing this package
needs neither lightning nor tensorboard.
"""

from neuron_sift.metrics.sifting_metrics import (
    DEFAULT_QUANTILES,
    EpochSiftingMetrics,
    SiftingMetrics,
    collect_metrics,
    find_epoch_loader,
    find_loader,
    find_sifting_loader,
    log_metrics,
    write_tensorboard,
)

__all__ = [
    "DEFAULT_QUANTILES",
    "EpochSiftingMetrics",
    "SiftingMetrics",
    "collect_metrics",
    "find_epoch_loader",
    "find_loader",
    "find_sifting_loader",
    "log_metrics",
    "write_tensorboard",
]
