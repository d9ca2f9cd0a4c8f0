"""The metrics surface of epoch-level sifting: one snapshot, as an object, flat scalars,
log lines and TensorBoard scalars.

``epoch_metrics(loader)`` reads an ``EpochSiftingDataloader`` (or a wrapper holding one as
``epoch_sifting_dataloader``, such as the Hugging Face Trainer after
``enable_epoch_sifting``) with ``loader.metrics()``: one host read of the score table on a
device. Scalars (``EpochSiftingMetrics.scalars()``): ``kept_share`` and ``mean_weight`` of
the current epoch's plan, ``max_weight``, ``scores_recorded``, ``num_nonfinite_losses``,
``excluded_by_guard``, ``epoch``, ``unpaired_batches``, ``batches_recorded``,
``planning_seconds``, ``machinery_seconds``. The Lightning callback and the Trainer
integration report these same scalars.
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from neuron_sift.metrics.sifting_metrics import find_wrapped

logger = logging.getLogger("neuron_sift.epoch.loader")

SCALARS = (
    "epoch",
    "kept_share",
    "mean_weight",
    "max_weight",
    "scores_recorded",
    "num_nonfinite_losses",
    "excluded_by_guard",
    "unpaired_batches",
    "batches_recorded",
    "planning_seconds",
    "machinery_seconds",
)


def find_epoch_loader(obj: Any):
    """The ``EpochSiftingDataloader`` in ``obj`` (itself, a wrapper's attribute, a list/dict)."""
    from neuron_sift.epoch.loader import EpochSiftingDataloader

    return find_wrapped(obj, EpochSiftingDataloader, ("epoch_sifting_dataloader", "loader", "iterables"))


@dataclass
class EpochSiftingMetrics:
    values: Dict[str, Any]
    epochs: List[dict] = field(default_factory=list)

    def scalars(self, prefix: str = "") -> Dict[str, float]:
        return {f"{prefix}{k}": float(self.values[k]) for k in SCALARS if self.values.get(k) is not None}


def epoch_metrics(obj: Any) -> EpochSiftingMetrics:
    loader = find_epoch_loader(obj)
    if loader is None:
        raise TypeError(f"no EpochSiftingDataloader found in {type(obj).__name__}")
    m = loader.metrics()
    epochs = m.pop("epochs")
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


def lightning_callback(prefix: str = "epoch_sifting/", on_step: bool = False):
    """A Lightning ``Callback`` that logs the scalars with ``pl_module.log_dict`` at the end of
    every training epoch (and every step with ``on_step=True``); finds the loader in
    ``trainer.train_dataloader``. Imports lightning only when called."""
    try:
        from lightning.pytorch import Callback
    except ImportError:  # pragma: no cover
        from pytorch_lightning import Callback

    class EpochSiftingMetricsCallback(Callback):
        def _log(self, trainer, pl_module):
            loader = find_epoch_loader(trainer.train_dataloader)
            if loader is None:
                return
            pl_module.log_dict(epoch_metrics(loader).scalars(prefix), on_step=False, on_epoch=True)

        def on_train_epoch_end(self, trainer, pl_module):
            self._log(trainer, pl_module)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if on_step:
                loader = find_epoch_loader(trainer.train_dataloader)
                if loader is not None:
                    pl_module.log_dict(epoch_metrics(loader).scalars(prefix), on_step=True, on_epoch=False)

    return EpochSiftingMetricsCallback()
