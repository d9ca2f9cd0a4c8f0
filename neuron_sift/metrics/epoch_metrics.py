"""The metrics surface of epoch-level sifting: one snapshot, as an object, flat scalars,
log lines and TensorBoard scalars.

``epoch_metrics(loader)`` reads an ``EpochSiftingDataloader`` (or a wrapper holding one as
``epoch_sifting_dataloader``, such as the Hugging Face Trainer after
``enable_epoch_sifting``) with ``loader.metrics()``: one host read of the score table on a
device. Scalars (``EpochSiftingMetrics.scalars()``): ``kept_share`` and ``mean_weight`` of
the current epoch's plan (of the samples trained: with ``drop_last`` the cut short batches
are not counted), ``max_weight``, ``scores_recorded``, ``num_nonfinite_losses``,
``excluded_by_guard``, ``epoch`` (the current epoch's 0-based index, as in the history and
the log lines; absent before the first epoch), ``epoch_finished`` (1 once every batch of it
on this rank has its losses), ``unpaired_batches``, ``batches_recorded``,
``batches_skipped``, ``planning_seconds``, ``machinery_seconds``, and ``planned_steps`` (the batches this rank
still trains, from ``loader.planned_steps()``: the planner's count, the same one the
Trainer integration sizes its epochs by, so a dashboard never shows a second estimate;
absent without ``num_epochs``). The Lightning callback and the Trainer integration report
these same scalars.
"""

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from neuron_sift.epoch.loader import EpochSiftingDataloader

from neuron_sift.metrics.sifting_metrics import find_wrapped
from neuron_sift.shared.logs import EPOCH_LOGGER

logger = logging.getLogger(EPOCH_LOGGER)

SCALARS = (
    "epoch",
    "epoch_finished",
    "kept_share",
    "mean_weight",
    "max_weight",
    "scores_recorded",
    "num_nonfinite_losses",
    "excluded_by_guard",
    "unpaired_batches",
    "batches_recorded",
    "batches_skipped",
    "planning_seconds",
    "machinery_seconds",
    "planned_steps",
)


def find_epoch_loader(obj: Any) -> Optional["EpochSiftingDataloader"]:
    """The ``EpochSiftingDataloader`` in ``obj`` (itself, a wrapper's attribute, a list/dict)."""
    from neuron_sift.epoch.loader import EpochSiftingDataloader

    return find_wrapped(obj, EpochSiftingDataloader, ("epoch_sifting_dataloader", "loader", "iterables"))


@dataclass
class EpochSiftingMetrics:
    values: dict[str, Any]
    epochs: list[dict[str, Any]] = field(default_factory=list)

    def scalars(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": float(self.values[k]) for k in SCALARS if self.values.get(k) is not None}


def epoch_metrics(obj: Any) -> EpochSiftingMetrics:
    loader = find_epoch_loader(obj)
    if loader is None:
        raise TypeError(f"no EpochSiftingDataloader found in {type(obj).__name__}")
    m = loader.metrics()
    epochs = m.pop("epochs")
    m["planned_steps"] = loader.planned_steps() if loader.num_epochs is not None else None
    return EpochSiftingMetrics(m, epochs)


def log_epoch_metrics(obj: Any, level: int = logging.INFO) -> EpochSiftingMetrics:
    """One log line per scalar on the loader's logger; returns the snapshot."""
    snap = epoch_metrics(obj)
    for k, v in snap.scalars().items():
        logger.log(level, "%s: %s", k, v)
    return snap


def write_epoch_tensorboard(obj: Any, writer: Any, step: int, prefix: str = "epoch_sifting/") -> EpochSiftingMetrics:
    """``writer.add_scalar`` for every scalar (``writer``: a ``torch.utils.tensorboard.SummaryWriter``)."""
    snap = epoch_metrics(obj)
    for k, v in snap.scalars(prefix).items():
        writer.add_scalar(k, v, step)
    return snap


def lightning_callback(prefix: str = "epoch_sifting/", on_step: bool = False) -> Any:
    """A Lightning ``Callback`` that logs the scalars with ``pl_module.log_dict`` at the end of
    every training epoch (and every step with ``on_step=True``); finds the loader in
    ``trainer.train_dataloader``. Imports lightning only when called."""
    try:
        from lightning.pytorch import Callback
    except ImportError:  # pragma: no cover
        from pytorch_lightning import Callback  # type: ignore[assignment]  # the same class, older package

    class EpochSiftingMetricsCallback(Callback):
        def _log(self, trainer: Any, pl_module: Any) -> None:
            loader = find_epoch_loader(trainer.train_dataloader)
            if loader is None:
                return
            pl_module.log_dict(epoch_metrics(loader).scalars(prefix), on_step=False, on_epoch=True)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self._log(trainer, pl_module)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if on_step:
                loader = find_epoch_loader(trainer.train_dataloader)
                if loader is not None:
                    pl_module.log_dict(epoch_metrics(loader).scalars(prefix), on_step=True, on_epoch=False)

    return EpochSiftingMetricsCallback()
