"""The one metrics surface of both modes: ``collect_metrics(obj)`` -> a snapshot, as an object,
flat scalars, log lines and TensorBoard scalars.

``collect_metrics(obj)`` finds the loader in ``obj`` (a ``SiftingDataloader`` or an
``EpochSiftingDataloader`` itself, or behind a wrapper: ``ExactLengthLoader``, a Hugging
Face ``Trainer`` after ``enable_sifting`` or ``enable_epoch_sifting``, Lightning's
``CombinedLoader``, a list or dict of loaders) and returns its snapshot
(``neuron_sift.metrics.snapshots``):

- ``SiftingMetrics`` for the per-batch loader: the counts and the observed kept share
  (kept / seen); the loss history's fill and quantiles (``torch.quantile`` over the valid
  entries; one host read of the history, ``loss_history_length`` floats); the latency of
  the sifting machinery (host seconds per phase, their sum without the user's scoring
  forward, ``machinery_seconds``, and per sifted source batch); on the XLA backend, the
  process's compilation count (``CompileTime`` samples of ``torch_xla.debug.metrics``;
  None on other backends).
- ``EpochSiftingMetrics`` for the epoch loader: its ``metrics()`` (one host read of the
  score table on a device) and the batches it still trains (``planned_steps``).

Either snapshot goes to ``log_metrics`` (INFO lines on the mode's logger) and
``write_tensorboard`` (tensorboard needed only when given a directory); the Lightning
callback (``neuron_sift.metrics.lightning``) and both Trainer integrations report the same
scalars.
"""

import logging
import os
from collections.abc import Sequence
from typing import Any

from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.metrics.snapshots import (
    DEFAULT_QUANTILES,
    EpochSiftingMetrics,
    SiftingMetrics,
    epoch_snapshot,
    quantile_key,
    sifting_snapshot,
)
from neuron_sift.shared.logs import EPOCH_LOGGER, LOADER_LOGGER

__all__ = [
    "DEFAULT_QUANTILES",
    "EpochSiftingMetrics",
    "LOADER_LOGGER",
    "SiftingMetrics",
    "collect_metrics",
    "find_epoch_loader",
    "find_loader",
    "find_sifting_loader",
    "find_wrapped",
    "log_metrics",
    "write_tensorboard",
]

# The attributes a wrapper keeps its loader under: ExactLengthLoader and the Trainer
# integrations (each mode's name), Lightning's CombinedLoader (``iterables``).
WRAPPER_ATTRIBUTES = ("sifting_dataloader", "epoch_sifting_dataloader", "loader", "iterables")
LOADERS = (SiftingDataloader, EpochSiftingDataloader)


def find_wrapped(obj: Any, kind: type | tuple[type, ...], attributes: tuple[str, ...], _depth: int = 0) -> Any:
    """The first ``kind`` instance in ``obj``: ``obj`` itself, what one of ``attributes`` of a
    wrapper holds, or the first one in a list, tuple or dict (searched six levels deep). None
    if none."""
    if _depth > 6 or obj is None:
        return None
    if isinstance(obj, kind):
        return obj
    for name in attributes:
        inner = getattr(obj, name, None)
        if inner is not None and inner is not obj:
            found = find_wrapped(inner, kind, attributes, _depth + 1)
            if found is not None:
                return found
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = find_wrapped(item, kind, attributes, _depth + 1)
            if found is not None:
                return found
    return None


def find_loader(obj: Any) -> SiftingDataloader | EpochSiftingDataloader | None:
    """The sifting loader of either mode in ``obj`` (see the module docstring), or None."""
    return find_wrapped(obj, LOADERS, WRAPPER_ATTRIBUTES)


def find_sifting_loader(obj: Any) -> SiftingDataloader | None:
    """The ``SiftingDataloader`` in ``obj``, or None."""
    return find_wrapped(obj, SiftingDataloader, WRAPPER_ATTRIBUTES)


def find_epoch_loader(obj: Any) -> EpochSiftingDataloader | None:
    """The ``EpochSiftingDataloader`` in ``obj``, or None."""
    return find_wrapped(obj, EpochSiftingDataloader, WRAPPER_ATTRIBUTES)


Snapshot = SiftingMetrics | EpochSiftingMetrics


def collect_metrics(obj: Any, quantiles: Sequence[float] = DEFAULT_QUANTILES) -> Any:
    """Snapshot the loader in ``obj``: a ``SiftingMetrics`` for a ``SiftingDataloader``, an
    ``EpochSiftingMetrics`` for an ``EpochSiftingDataloader`` (``quantiles`` of the loss
    history apply to the first only). Raises ``TypeError`` when ``obj`` holds neither.

    Host reads: the loader's counters (and, per-batch, the loss history once; per epoch,
    the score table once). Cheap on CPU; on XLA call it every few hundred steps, not every step.
    """
    loader = find_loader(obj)
    if loader is None:
        raise TypeError(f"no SiftingDataloader or EpochSiftingDataloader found in {type(obj).__name__}")
    if isinstance(loader, SiftingDataloader):
        return sifting_snapshot(loader, quantiles)
    return epoch_snapshot(loader)


def _snapshot(metrics: Any) -> Any:
    return metrics if isinstance(metrics, (SiftingMetrics, EpochSiftingMetrics)) else collect_metrics(metrics)


def log_metrics(metrics: Any, logger: logging.Logger | None = None, level: int = logging.INFO) -> Any:
    """Log a snapshot as ``name: value`` lines (default: INFO on the mode's logger,
    ``neuron_sift.dataloader.sift_dataloader`` or ``neuron_sift.epoch.loader``).

    ``metrics``: a snapshot or anything ``collect_metrics`` reads (then collected first).
    Per-batch lines, in this order: ``num_orig_samples_seen: N``, ``num_orig_samples_kept:
    N`` (the same format as the per-batch lines smart_sifting users parse),
    ``observed_kept_share: X``, ``loss_history_fill: N``, ``loss_history_q<percent>: X``
    per quantile, ``sifting_machinery_seconds: X``, ``sifting_machinery_latency: X``,
    ``sifting_batch_creation_latency: X``, and ``xla_compile_count: N`` on XLA. Epoch lines:
    one per scalar of ``EpochSiftingMetrics.scalars()``. Returns the snapshot.
    """
    metrics = _snapshot(metrics)
    if isinstance(metrics, EpochSiftingMetrics):
        log = logger if logger is not None else logging.getLogger(EPOCH_LOGGER)
        if log.isEnabledFor(level):
            for k, v in metrics.scalars().items():
                log.log(level, "%s: %s", k, v)
        return metrics
    log = logger if logger is not None else logging.getLogger(LOADER_LOGGER)
    if not log.isEnabledFor(level):
        return metrics
    log.log(level, "num_orig_samples_seen: %d", metrics.num_orig_samples_seen)
    log.log(level, "num_orig_samples_kept: %d", metrics.num_orig_samples_kept)
    log.log(level, "observed_kept_share: %.6f", metrics.observed_kept_share)
    log.log(level, "loss_history_fill: %d", metrics.history_fill)
    for q, v in metrics.history_quantiles.items():
        log.log(level, "%s: %.6g", quantile_key(q), v)
    log.log(level, "sifting_machinery_seconds: %.6f", metrics.machinery_seconds)
    log.log(level, "sifting_machinery_latency: %.6f", metrics.machinery_latency)
    log.log(level, "sifting_batch_creation_latency: %.6f", metrics.batch_creation_latency)
    if metrics.compile_count is not None:
        log.log(level, "xla_compile_count: %d", metrics.compile_count)
    return metrics


def write_tensorboard(metrics: Any, writer: Any, global_step: int | None = None, prefix: str | None = None) -> Any:
    """Write a snapshot's scalars to TensorBoard under ``prefix`` (default: the mode's,
    ``sifting/`` or ``epoch_sifting/``; e.g. ``sifting/observed_kept_share``).

    ``writer``: a ``torch.utils.tensorboard.SummaryWriter`` (or anything with
    ``add_scalar``), or a log directory, for which a writer is opened, flushed and closed.
    ``global_step`` defaults to the batches emitted (per-batch) or recorded (epoch).
    ``metrics``: a snapshot or anything ``collect_metrics`` reads. Needs the ``tensorboard``
    package only when given a directory. Returns the snapshot.

    Raises:
        ImportError: given a directory without the ``tensorboard`` package (the message
            says how to install it, or to pass a writer instead).
    """
    metrics = _snapshot(metrics)
    step = metrics.step if global_step is None else int(global_step)
    own = isinstance(writer, (str, os.PathLike))
    if own:
        writer = _summary_writer(os.fspath(writer))
    try:
        scalars = metrics.scalars(metrics.default_prefix if prefix is None else prefix)
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)
    finally:
        if own:
            writer.flush()
            writer.close()
    return metrics


def _summary_writer(log_dir: str) -> Any:
    """A ``SummaryWriter`` on ``log_dir``, or an ImportError that names the missing package:
    torch's own is a bare ``No module named 'tensorboard'`` from inside torch."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(
            f"write_tensorboard to a log directory ({log_dir!r}) needs the tensorboard package: pip install "
            f"tensorboard; or pass a writer with add_scalar(tag, value, step) instead of a directory ({exc})"
        ) from exc
    return SummaryWriter(log_dir=log_dir)
