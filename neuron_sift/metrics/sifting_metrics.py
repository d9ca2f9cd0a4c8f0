"""One metrics surface for every integration: a ``SiftingMetrics`` snapshot of a loader.

``collect_metrics(loader)`` reads a ``SiftingDataloader`` (or a wrapper holding one, such
as ``ExactLengthLoader``, a Hugging Face ``Trainer`` after ``enable_sifting``, or a list or
dict of loaders) and returns:

- the counts (``loader.counts``) and the kept share (kept / seen);
- the loss history: how many entries are filled and their quantiles (``torch.quantile``
  over the valid entries; one host read of the history, ``loss_history_length`` floats);
- the latency of the sifting machinery: host seconds per phase, their sum without the
  user's scoring forward (``machinery_seconds``), and per sifted source batch;
- on the XLA backend, the process's compilation count (``CompileTime`` samples of
  ``torch_xla.debug.metrics``; None on other backends).

The same snapshot is available as a Python object (``SiftingMetrics``), as flat scalars
for any logger (``.scalars()``), as INFO log lines on the loader's logger
(``log_metrics``) and as TensorBoard scalars (``write_tensorboard``, tensorboard needed
only when called). The Lightning callback and the Hugging Face integration report these
same scalars.
"""

import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.shared.logs import LOADER_LOGGER

#: The logger of smart_sifting's documented lines (``...dataloader.sift_dataloader``).

DEFAULT_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def find_wrapped(obj: Any, kind: type, attributes: tuple[str, ...], _depth: int = 0) -> Any:
    """The first ``kind`` instance in ``obj``: ``obj`` itself, what one of ``attributes`` of a
    wrapper holds, or the first one in a list, tuple or dict (searched six levels deep). None
    if none. Both kinds of sifting find their loader behind Trainer and Lightning wrappers so."""
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


def find_sifting_loader(obj: Any) -> SiftingDataloader | None:
    """The ``SiftingDataloader`` in ``obj``: the loader itself, a wrapper's ``sifting_dataloader``
    attribute (``ExactLengthLoader``, a Trainer after ``enable_sifting``), Lightning's
    ``CombinedLoader.iterables``, or the first one in a list, tuple or dict. None if none."""
    return find_wrapped(obj, SiftingDataloader, ("sifting_dataloader", "iterables"))


def _quantile_key(q: float) -> str:
    return f"loss_history_q{q * 100:g}"


@dataclass
class SiftingMetrics:
    """A snapshot of one ``SiftingDataloader``. Counts follow ``SiftingCounts``.

    ``machinery_seconds``: host seconds in sifting itself (transform, should_sift, sift,
    accumulate, reverse_transform), without the user's scoring forward, which is
    ``scoring_seconds``. ``machinery_latency``: ``machinery_seconds`` per sifted
    (non-delayed) source batch. ``batch_creation_latency``: machinery plus scoring seconds
    per emitted sifted batch (the mean of the logged ``sifted_batch_creation_latency``).
    On XLA these are host (tracing) times; the device runs asynchronously.
    ``compile_count``: compilations in this process so far (XLA backend only, else None).
    """

    num_orig_samples_seen: int
    num_orig_samples_kept: int
    num_orig_samples_sifted: int
    num_samples_emitted: int
    num_samples_pending: int
    num_batches_emitted: int
    num_source_batches: int
    num_source_batches_delayed: int
    num_nonfinite_losses: int
    kept_share: float
    history_fill: int
    history_length: int
    history_quantiles: dict[float, float]
    machinery_seconds: float
    scoring_seconds: float
    machinery_latency: float
    batch_creation_latency: float
    compile_count: int | None
    backend: str
    selection_mode: str
    epoch: int
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def scalars(self, prefix: str = "") -> dict[str, float]:
        """Flat ``name -> number`` for loggers (Lightning, the HF Trainer, TensorBoard).

        Names: the counts, ``kept_share``, ``history_fill``, ``loss_history_q<percent>``
        (e.g. ``loss_history_q50``), ``machinery_seconds``, ``scoring_seconds``,
        ``machinery_latency``, ``batch_creation_latency``, and ``compile_count`` on XLA;
        each prefixed with ``prefix``.
        """
        out: dict[str, float] = {
            "num_orig_samples_seen": self.num_orig_samples_seen,
            "num_orig_samples_kept": self.num_orig_samples_kept,
            "num_orig_samples_sifted": self.num_orig_samples_sifted,
            "num_samples_pending": self.num_samples_pending,
            "num_batches_emitted": self.num_batches_emitted,
            "num_nonfinite_losses": self.num_nonfinite_losses,
            # Kept samples a data-parallel rank dropped at its max_pending bound (0 otherwise).
            "num_samples_dropped": self.counts.get("num_samples_dropped", 0),
            "kept_share": self.kept_share,
            "history_fill": self.history_fill,
        }
        for q, v in self.history_quantiles.items():
            out[_quantile_key(q)] = v
        out["machinery_seconds"] = self.machinery_seconds
        out["scoring_seconds"] = self.scoring_seconds
        out["machinery_latency"] = self.machinery_latency
        out["batch_creation_latency"] = self.batch_creation_latency
        if self.compile_count is not None:
            out["compile_count"] = self.compile_count
        return {prefix + k: v for k, v in out.items()}


def history_quantiles(loader: SiftingDataloader, quantiles: Sequence[float] = DEFAULT_QUANTILES, fill=None):
    """Quantiles of the valid part of the loss history (the first ``fill`` entries); {} if empty."""
    qs = [float(q) for q in quantiles]
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantiles must lie in [0, 1], got {q}")
    state = loader.sifter.state
    if fill is None:
        fill = int(loader.backend.to_host(state.fill))
    if fill <= 0 or not qs:
        return {}
    valid = loader.backend.to_host(state.history)[:fill].float()
    values = torch.quantile(valid, torch.tensor(qs, dtype=torch.float32))
    return {q: float(v) for q, v in zip(qs, values.tolist())}


def collect_metrics(loader: Any, quantiles: Sequence[float] = DEFAULT_QUANTILES) -> SiftingMetrics:
    """Snapshot ``loader`` (a ``SiftingDataloader`` or anything ``find_sifting_loader`` resolves).

    Host reads: the device counters and history fill (``loader.metrics()``) and the loss
    history once. Cheap on CPU; on XLA call it every few hundred steps, not every step.
    """
    sl = find_sifting_loader(loader)
    if sl is None:
        raise TypeError(f"no SiftingDataloader found in {type(loader).__name__}")
    raw = sl.metrics()
    counts = {k: raw[k] for k in sl.counts.names()}
    fill = int(raw["history_fill"])
    timings = {k: dict(v) for k, v in raw.get("timings", {}).items()}
    scoring = float(timings.get("calculate_relevance_values", {}).get("seconds", 0.0))
    machinery = float(raw["machinery_seconds"])
    sifted_sources = counts["num_source_batches"] - counts["num_source_batches_delayed"]
    sifted_batches = counts["num_batches_emitted"] - counts["num_source_batches_delayed"]
    compile_count = sl.backend.compile_count()
    return SiftingMetrics(
        num_orig_samples_seen=counts["num_orig_samples_seen"],
        num_orig_samples_kept=counts["num_orig_samples_kept"],
        num_orig_samples_sifted=counts["num_orig_samples_sifted"],
        num_samples_emitted=counts["num_samples_emitted"],
        num_samples_pending=counts["num_samples_pending"],
        num_batches_emitted=counts["num_batches_emitted"],
        num_source_batches=counts["num_source_batches"],
        num_source_batches_delayed=counts["num_source_batches_delayed"],
        num_nonfinite_losses=counts["num_nonfinite_losses"],
        kept_share=float(raw["kept_share"]),
        history_fill=fill,
        history_length=sl.sift_config.loss_history_length,
        history_quantiles=history_quantiles(sl, quantiles, fill),
        machinery_seconds=machinery,
        scoring_seconds=scoring,
        machinery_latency=machinery / sifted_sources if sifted_sources > 0 else 0.0,
        batch_creation_latency=(machinery + scoring) / sifted_batches if sifted_batches > 0 else 0.0,
        compile_count=compile_count,
        backend=str(getattr(sl.backend, "name", "")),
        selection_mode=sl.selection_mode,
        epoch=sl.epoch,
        timings=timings,
        counts=counts,
    )


def log_metrics(metrics: Any, logger: logging.Logger | None = None, level: int = logging.INFO) -> SiftingMetrics:
    """Log a snapshot as ``name: value`` lines (default: INFO on the loader's logger).

    Lines, in this order: ``num_orig_samples_seen: N``, ``num_orig_samples_kept: N`` (the
    same format as the per-batch lines smart_sifting users parse), ``kept_share: X``,
    ``loss_history_fill: N``, ``loss_history_q<percent>: X`` per quantile,
    ``sifting_machinery_seconds: X``, ``sifting_machinery_latency: X``,
    ``sifting_batch_creation_latency: X``, and ``xla_compile_count: N`` on XLA.
    ``metrics`` is a ``SiftingMetrics`` or a loader (then collected first). Returns the snapshot.
    """
    if not isinstance(metrics, SiftingMetrics):
        metrics = collect_metrics(metrics)
    log = logger if logger is not None else logging.getLogger(LOADER_LOGGER)
    if not log.isEnabledFor(level):
        return metrics
    log.log(level, "num_orig_samples_seen: %d", metrics.num_orig_samples_seen)
    log.log(level, "num_orig_samples_kept: %d", metrics.num_orig_samples_kept)
    log.log(level, "kept_share: %.6f", metrics.kept_share)
    log.log(level, "loss_history_fill: %d", metrics.history_fill)
    for q, v in metrics.history_quantiles.items():
        log.log(level, "%s: %.6g", _quantile_key(q), v)
    log.log(level, "sifting_machinery_seconds: %.6f", metrics.machinery_seconds)
    log.log(level, "sifting_machinery_latency: %.6f", metrics.machinery_latency)
    log.log(level, "sifting_batch_creation_latency: %.6f", metrics.batch_creation_latency)
    if metrics.compile_count is not None:
        log.log(level, "xla_compile_count: %d", metrics.compile_count)
    return metrics


def write_tensorboard(
    metrics: Any, writer: Any, global_step: int | None = None, prefix: str = "sifting/"
) -> SiftingMetrics:
    """Write a snapshot's scalars to TensorBoard under ``prefix`` (e.g. ``sifting/kept_share``).

    ``writer``: a ``torch.utils.tensorboard.SummaryWriter`` (or anything with
    ``add_scalar``), or a log directory, for which a writer is opened, flushed and closed.
    ``global_step`` defaults to the number of emitted batches. ``metrics`` is a
    ``SiftingMetrics`` or a loader. Needs the ``tensorboard`` package only when given a
    directory. Returns the snapshot.
    """
    if not isinstance(metrics, SiftingMetrics):
        metrics = collect_metrics(metrics)
    step = metrics.num_batches_emitted if global_step is None else int(global_step)
    own = isinstance(writer, (str, os.PathLike))
    if own:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=os.fspath(writer))
    try:
        for name, value in metrics.scalars(prefix).items():
            writer.add_scalar(name, value, step)
    finally:
        if own:
            writer.flush()
            writer.close()
    return metrics
