"""Sifting metrics: ``collect_metrics(loader)`` -> ``SiftingMetrics``, as log lines or TensorBoard scalars.

``neuron_sift.metrics.lightning.TrainingMetricsRecorder`` (smart_sifting's Lightning
callback) needs ``lightning`` and is imported from its own module; importing this package
needs neither lightning nor tensorboard.
"""

from neuron_sift.metrics.sifting_metrics import (
    DEFAULT_QUANTILES,
    SiftingMetrics,
    collect_metrics,
    find_sifting_loader,
    log_metrics,
    write_tensorboard,
)

__all__ = [
    "DEFAULT_QUANTILES",
    "SiftingMetrics",
    "collect_metrics",
    "find_sifting_loader",
    "log_metrics",
    "write_tensorboard",
]
