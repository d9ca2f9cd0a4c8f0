"""``TrainingMetricsRecorder``: smart_sifting's Lightning callback, recording sifting metrics
of either mode.

Add it to a Lightning ``Trainer`` whose ``LightningModule.train_dataloader()`` returns a
``SiftingDataloader`` (built with ``model=self``), an ``EpochSiftingDataloader``, or an
``ExactLengthLoader`` around either. Every ``log_every_n_steps`` training batches and at
the end of every training epoch it takes a snapshot (``neuron_sift.metrics.collect_metrics``:
a ``SiftingMetrics`` or an ``EpochSiftingMetrics``) and sends its scalars (per-batch: seen
and kept counts, observed kept share, loss-history quantiles, sifting latency, compile
count on XLA; epoch: the plan's share and weights, recorded scores, planned steps) to
every logger of the Trainer (``trainer.loggers``: TensorBoard, CSV, ...) under the mode's
prefix (``sifting/`` or ``epoch_sifting/``). ``recorder.last`` is the latest snapshot and
``recorder.records`` every ``(global_step, snapshot)`` taken.

Lightning reads ``len(train_dataloader)`` once and ends every epoch after that many
batches. A ``SiftingDataloader``'s epochs vary around that length (probabilistic mode;
and in both modes the delay and the carried-over samples), so an epoch that would emit
more batches is cut short, and the rest of that pass over the source data is never used
(an epoch of exactly the planned length is not: in fixed mode the loader scores the
remaining source batches before handing out its last planned batch).
The recorder detects this and warns (``recorder.cut_epochs`` lists them); return
``ExactLengthLoader(loader, epochs=max_epochs)`` from ``train_dataloader()`` to make every
epoch exactly as long as Lightning expects.

Needs ``lightning`` (or the older ``pytorch_lightning``); ``import neuron_sift`` does not.
"""

from collections.abc import Sequence
from typing import Any

try:
    from lightning.pytorch import Callback
    from lightning.pytorch.utilities import rank_zero_warn
except ImportError:  # pragma: no cover - the older package name
    try:
        from pytorch_lightning import Callback  # type: ignore[assignment]  # the same class, older package
        from pytorch_lightning.utilities import rank_zero_warn
    except ImportError as exc:
        raise ImportError("neuron_sift.metrics.lightning needs PyTorch Lightning: pip install lightning") from exc

from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.metrics.sifting_metrics import DEFAULT_QUANTILES, collect_metrics, find_loader
from neuron_sift.metrics.snapshots import EpochSiftingMetrics, SiftingMetrics
from neuron_sift.shared.sources import underlying_dataloader
from neuron_sift.shared.validation import positive_int


class TrainingMetricsRecorder(Callback):
    """Lightning callback: logs sifting metrics through the Trainer's loggers.

    ``loader``: the ``SiftingDataloader`` or ``EpochSiftingDataloader`` to record (default:
    found in ``trainer.train_dataloader`` when training starts). ``log_every_n_steps``:
    record every that many training batches (default: the Trainer's ``log_every_n_steps``);
    a snapshot is also taken at the end of each training epoch. ``quantiles`` of the loss
    history to report (per-batch). ``prefix`` of the logged names (default: the mode's,
    ``sifting/`` or ``epoch_sifting/``).
    """

    def __init__(
        self,
        loader: Any = None,
        log_every_n_steps: int | None = None,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        prefix: str | None = None,
    ):
        super().__init__()
        self.log_every_n_steps = positive_int(log_every_n_steps, "log_every_n_steps", allow_none=True)
        self.loader = loader
        self.quantiles = tuple(quantiles)
        self.prefix = prefix
        self.records: list[tuple[int, SiftingMetrics | EpochSiftingMetrics]] = []
        self.last: SiftingMetrics | EpochSiftingMetrics | None = None
        self.cut_epochs: list[int] = []
        self._sifting: Any = None  # the loader recorded, of either mode
        self._direct = False
        self._batches = 0
        self._epoch_start_sources = 0

    # -- locating the loader -----------------------------------------------------------------

    def _resolve(self, trainer: Any) -> Any:
        target = self.loader if self.loader is not None else trainer.train_dataloader
        sifting = find_loader(target)
        if sifting is None:
            rank_zero_warn(
                "TrainingMetricsRecorder: no SiftingDataloader (or EpochSiftingDataloader) found in the training "
                "dataloader; nothing will be recorded (pass loader=... or return a SiftingDataloader from "
                "train_dataloader())"
            )
            return None
        if not isinstance(sifting, SiftingDataloader):  # an epoch loader plans its own epochs: none is cut
            self._direct = False
            return sifting
        # Whether Lightning iterates the SiftingDataloader itself (then an epoch is one pass).
        train = trainer.train_dataloader
        self._direct = train is sifting or (isinstance(train, (list, tuple)) and any(t is sifting for t in train))
        if isinstance(train, dict):
            self._direct = any(t is sifting for t in train.values())
        return sifting

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._sifting = self._resolve(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._sifting is None:
            self._sifting = self._resolve(trainer)
        if isinstance(self._sifting, SiftingDataloader):
            self._epoch_start_sources = self._sifting.counts.num_source_batches

    # -- recording ---------------------------------------------------------------------------

    def record(self, trainer: Any) -> SiftingMetrics | EpochSiftingMetrics | None:
        """Take a snapshot now and send it to the Trainer's loggers (rank zero logs)."""
        if self._sifting is None:
            return None
        metrics = collect_metrics(self._sifting, self.quantiles)
        step = int(trainer.global_step)
        self.last = metrics
        self.records.append((step, metrics))
        scalars = metrics.scalars(metrics.default_prefix if self.prefix is None else self.prefix)
        for lg in trainer.loggers:
            lg.log_metrics(scalars, step=step)
        return metrics

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._sifting is None:
            return
        self._batches += 1
        every = self.log_every_n_steps or max(int(getattr(trainer, "log_every_n_steps", 50) or 50), 1)
        # The epoch's last batch is recorded by on_train_epoch_end, at the same global step:
        # recording it here too would log that step twice.
        last = getattr(trainer, "num_training_batches", None)
        if self._batches % every == 0 and not (isinstance(last, int) and batch_idx + 1 >= last):
            self.record(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._sifting is None:
            return
        self.record(trainer)
        if self._direct:
            self._check_epoch_complete(trainer)

    def _check_epoch_complete(self, trainer: Any) -> None:
        sifting = self._sifting
        assert sifting is not None  # called by on_train_epoch_end only once a loader was found
        try:
            n_source = len(underlying_dataloader(sifting.orig_dataloader))
        except TypeError:
            return
        used = sifting.counts.num_source_batches - self._epoch_start_sources
        if 0 < used < n_source:
            epoch = int(trainer.current_epoch)
            self.cut_epochs.append(epoch)
            rank_zero_warn(
                f"TrainingMetricsRecorder: Lightning ended epoch {epoch} after len(train_dataloader) = "
                f"{trainer.num_training_batches} batches, when the sifted loader had used {used} of its "
                f"{n_source} source batches; the rest of this pass is skipped. Return "
                "neuron_sift.integrations.schedules.ExactLengthLoader(loader, epochs=max_epochs) from "
                "train_dataloader() so that every epoch has exactly the length Lightning expects."
            )
