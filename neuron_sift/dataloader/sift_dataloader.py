"""``SiftingDataloader``: wraps a DataLoader and yields full batches of kept samples.

Per source batch: transform to a ``SiftingBatch``, score every sample with the user's
loss in an eval-mode, no-grad forward pass, select (``neuron_sift.engine``), and
accumulate the kept samples; every time ``batch_size`` kept samples are waiting, one batch
is emitted in the user's own format. The training loop does not change.

Counting rules (see README): ``sift_delay`` counts source batches from the start of
training, which during the delay are passed through unchanged and so are training steps
too. Kept samples not yet emitted at the end of an epoch are carried into the next epoch
and emitted first; nothing is repeated. Samples are dropped only under data-parallel
agreement in probabilistic mode, when a rank keeps more than its peers and its pending
samples would pass ``max_pending`` (counted, logged; see ``SiftingCounts``).
"""

import contextlib
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch

from neuron_sift.backends import resolve_backend
from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.default_batch import DefaultBatchTransform, DefaultSiftingBatch
from neuron_sift.dataloader.accumulator import BatchAccumulator
from neuron_sift.dataloader.notices import drop_notice, nonfinite_notice
from neuron_sift.dataloader.planning import plan_epochs
from neuron_sift.dataloader.scoring import check_losses, model_device, scoring_mode
from neuron_sift.dataloader.source_loader import sampler_info, underlying_dataloader
from neuron_sift.dataloader.checkpoint import PendingSamples, loader_state, restore_loader_state
from neuron_sift.dataloader.device_staging import DeviceStaging, batch_to_device, pad_batch, staged_selection
from neuron_sift.distributed import RankGroup
from neuron_sift.engine.sifter import Sifter
from neuron_sift.exceptions import UnsupportedDataFormatException, add_context
from neuron_sift.loss.abstract_sift_loss_module import resolve_loss_fn
from neuron_sift.sift_config.sift_configs import coerce_sift_config

logger = logging.getLogger(__name__)


@dataclass
class SiftingCounts:
    """Host-side accounting. Invariants: seen == kept + sifted; kept == emitted + pending + dropped.

    ``num_samples_dropped``: kept samples a data-parallel rank let go because its pending
    samples reached ``max_pending`` while its peers kept fewer (always 0 in one process and
    in fixed mode).

    Attributes:
        num_orig_samples_seen: source samples that reached the loader (delayed ones included).
        num_orig_samples_kept: samples kept (delayed ones included).
        num_orig_samples_sifted: samples left out.
        num_samples_emitted: samples handed to the training loop.
        num_samples_pending: kept samples waiting for a full batch.
        num_batches_emitted: batches handed to the training loop.
        num_source_batches: source batches read.
        num_source_batches_delayed: source batches passed through during ``sift_delay``.
        num_nonfinite_losses: NaN or infinite losses seen (kept, never recorded in the history).
        num_samples_dropped: kept samples dropped under the data-parallel backlog bound.
    """

    num_orig_samples_seen: int = 0
    num_orig_samples_kept: int = 0
    num_orig_samples_sifted: int = 0
    num_samples_emitted: int = 0
    num_samples_pending: int = 0
    num_batches_emitted: int = 0
    num_source_batches: int = 0
    num_source_batches_delayed: int = 0
    num_nonfinite_losses: int = 0
    num_samples_dropped: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class SiftingDataloader:
    """Wraps ``orig_dataloader``; yields batches of ``batch_size`` high-loss samples.

    Arguments as in smart_sifting: ``sift_config`` (a ``RelativeProbabilisticSiftConfig``
    or dict), ``orig_dataloader``, ``batch_transforms`` (a ``SiftingBatchTransform``;
    None handles tensors, lists, tuples and dicts), ``loss_impl`` (a ``Loss``), ``model``,
    ``log_batch_data`` (log per-batch losses and kept indices; costly, for pilot runs),
    ``batch_format_index`` (0: indexed by sample, 1: by feature; settles ambiguous lists).
    ``backend`` (neuron_sift addition): ``"eager"``, ``"xla"`` or None to follow the model.
    ``log_batch_contents`` (neuron_sift addition): also log each emitted batch's contents;
    ``log_batch_data`` alone logs losses and indices, never sample contents. The library
    writes nothing to disk or network: logs go to the ``logging`` handlers you configure.
    ``max_pending`` (neuron_sift addition): under data-parallel agreement in probabilistic
    mode, the most kept samples a rank holds back (default four batches); see README.

    Args:
        sift_config: a ``RelativeProbabilisticSiftConfig`` or an equivalent dict.
        orig_dataloader: any iterable of batches; a ``torch.utils.data.DataLoader`` (or
            torch-xla's ``MpDeviceLoader`` around one) also gives the batch size and the
            planned length.
        batch_transforms: a ``SiftingBatchTransform``, or None for the default handling of
            tensors, lists, tuples and dicts.
        loss_impl: a ``Loss``, or any object with ``loss(model, transformed_batch,
            original_batch=None)`` returning one loss per sample.
        model: the ``torch.nn.Module`` that scores the samples (a LightningModule works; under
            DDP pass the plain module). The backend follows its device.
        log_batch_data: log each source batch's losses, kept losses and kept indices at INFO
            (host reads; for pilot runs).
        batch_format_index: ``0`` (indexed by sample) or ``1`` (indexed by feature) to settle
            an ambiguous list or tuple batch; None to detect.
        backend: ``"eager"``, ``"compiled"`` (the step as one ``torch.compile`` graph),
            ``"xla"``, a backend object, or None to follow the model's device.
        log_batch_contents: also log each emitted batch's contents.
        distributed: None follows ``torch.distributed`` (the ranks agree on equal steps when a
            process group is initialised); False opts out.
        max_pending: probabilistic mode under data-parallel agreement: the most kept samples a
            rank holds back (None: four batches); newly kept samples beyond it are dropped and
            counted.

    Iterating yields batches of exactly ``batch_size`` kept samples in the source loader's own
    format (through ``reverse_transform`` when a transform is given).

    Raises:
        SiftConfigValidationException: the config is invalid (at construction), or fixed mode
            would keep no sample of a batch (at the first batch).
        LossImplementationNotProvidedException: ``loss_impl`` is missing or has no usable
            ``loss`` method.
        TypeError: ``orig_dataloader`` is not iterable, ``model`` is not a module, or an
            argument has the wrong type.
        ValueError: an unknown backend, or one that cannot run on the model's device.
        LossOutputException: while iterating, the loss did not return one floating value per
            sample on the model's device.
        UnsupportedDataFormatException: while iterating, a batch the default handling cannot
            split.
    """

    def __init__(
        self,
        sift_config: Any,
        orig_dataloader: Any,
        batch_transforms: Any = None,
        loss_impl: Any = None,
        model: Optional[torch.nn.Module] = None,
        log_batch_data: bool = False,
        batch_format_index: Optional[int] = None,
        *,
        backend: Optional[str] = None,
        log_batch_contents: bool = False,
        distributed: Optional[bool] = None,
        max_pending: Optional[int] = None,
    ):
        self.sift_config = coerce_sift_config(sift_config)
        if orig_dataloader is None or not hasattr(orig_dataloader, "__iter__"):
            raise TypeError(f"orig_dataloader must be an iterable of batches, got {type(orig_dataloader).__name__}")
        self.orig_dataloader = orig_dataloader
        self.loss_impl = loss_impl
        self._loss_fn = resolve_loss_fn(loss_impl)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (or LightningModule), got {type(model).__name__}")
        self.model = model
        if not isinstance(log_batch_data, bool):
            raise TypeError(f"log_batch_data must be a bool, got {type(log_batch_data).__name__}")
        self.log_batch_data = log_batch_data
        if not isinstance(log_batch_contents, bool):
            raise TypeError(f"log_batch_contents must be a bool, got {type(log_batch_contents).__name__}")
        self.log_batch_contents = log_batch_contents
        self._planning_loader = underlying_dataloader(orig_dataloader)
        info = sampler_info(self._planning_loader)
        nominal = info[0] if info is not None else getattr(self._planning_loader, "batch_size", None)
        self._batch_size: Optional[int] = nominal if isinstance(nominal, int) and nominal > 0 else None
        if batch_transforms is None:
            self.batch_transforms = DefaultBatchTransform(self._first_batch_size(), batch_format_index)
        else:
            for name in ("transform", "reverse_transform"):
                if not callable(getattr(batch_transforms, name, None)):
                    raise TypeError(
                        f"batch_transforms must have callable transform(batch) and reverse_transform(sifting_batch); "
                        f"{type(batch_transforms).__name__} has no {name}"
                    )
            self.batch_transforms = batch_transforms
        self.batch_format_index = batch_format_index
        self.backend = resolve_backend(model_device(model), backend)
        self.ranks = RankGroup(distributed, self.backend.device)
        self.sifter = Sifter(self.sift_config, self.backend, self.ranks)
        # Probabilistic mode under torch.distributed: ranks agree on how many batches to emit
        # every `_sync_every` scored source batches (about once per emitted batch) and at the
        # end of each epoch, with one all-reduce(MIN) of one int64.
        self._coordinated = self.ranks.active and self.sift_config.selection_mode == "probabilistic"
        if max_pending is not None and (isinstance(max_pending, bool) or not isinstance(max_pending, int)):
            raise TypeError(f"max_pending must be an int, got {type(max_pending).__name__}")
        self._max_pending_arg = max_pending
        self._budget_left = 0  # batches agreed at the last agreement point and not yet emitted
        self._sync_every = max(1, int(1.0 + self.sift_config.beta_value))
        self._since_sync = 0
        self.counts = SiftingCounts()
        self._nonfinite_notice, self._drop_notice = nonfinite_notice(logger), drop_notice(logger)
        self._accumulator = BatchAccumulator()
        self._staging: Optional[DeviceStaging] = None
        self._delay_progress = 0
        self._epoch = 0
        self._iteration_token = 0
        self._epoch_in_progress = False
        self._consumed = 0  # source batches of the current epoch fully counted
        self._resume_skip: Optional[int] = None  # set by load_state_dict() mid-epoch
        self._restored: Optional[PendingSamples] = None
        self._epoch_planned: Optional[int] = None  # fixed mode: batches this epoch (or its resumed rest) emits
        self._resume_like: Optional[Tuple[int, Any]] = None  # a skipped source batch, to bind restored samples
        self._emitted_in_epoch = 0
        self._epoch_source: Optional[Iterator[Any]] = None
        # Host seconds and calls per phase: transform, calculate_relevance_values (the
        # user's scoring forward), should_sift, sift, accumulate, reverse_transform.
        self.timings: dict = {}

    def _first_batch_size(self) -> Optional[int]:
        """Samples in the source loader's first batch: the batch size, or fewer when the
        whole dataset is smaller (then that single batch is short). Used to tell which
        dimension of a list holds the samples."""
        b = self._batch_size
        info = sampler_info(self._planning_loader)
        if b is not None and info is not None and 0 < info[1] < b and not info[2]:
            return info[1]
        return b

    # -- public properties -------------------------------------------------------------

    @property
    def batch_size(self) -> Optional[int]:
        """Size of every emitted batch: the source loader's batch size (or its first batch's)."""
        return self._batch_size

    @property
    def selection_mode(self) -> str:
        return self.sift_config.selection_mode

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def max_pending(self) -> Optional[int]:
        """The most kept samples a rank holds back under data-parallel agreement (probabilistic
        mode); None until the batch size is known."""
        if self._max_pending_arg is not None:
            if self._batch_size is not None and self._max_pending_arg < self._batch_size:
                raise ValueError(f"max_pending={self._max_pending_arg} is below the batch size {self._batch_size}")
            return self._max_pending_arg
        return None if self._batch_size is None else 4 * self._batch_size

    def __len__(self) -> int:
        """Batches the next epoch emits: exact in ``fixed`` mode, an estimate in ``probabilistic``.

        After ``load_state_dict()`` of a checkpoint taken mid-epoch, the batches the resumed
        epoch still emits (its first iteration continues that epoch).

        The estimate is the expected count (kept share ``1 / (1 + beta)`` of the source
        samples after the delay, plus the samples already pending), so a learning-rate
        schedule or a Trainer sized from ``len(loader)`` ends near its planned end; the
        actual count varies by a few batches. Raises ``TypeError`` when the source loader
        has no length (like a DataLoader over an IterableDataset).

        Returns:
            The number of batches of the next epoch (or of the rest of a resumed one).
        """
        return self.estimated_length()

    def estimated_length(self) -> int:
        """Expected number of batches of the next epoch (exact in ``fixed`` mode)."""
        return plan_epochs(self, 1, self._resume_skip or 0)[0][0]

    @property
    def length_is_exact(self) -> bool:
        """Whether ``len(loader)`` is exact (fixed mode) rather than an expectation."""
        return self.selection_mode == "fixed"

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """Start the next epoch (or continue a resumed one).

        The epoch starts here, not at the first ``next()``: a consumer that takes
        ``len(loader)`` batches of a resumed epoch with nothing left (``len() == 0``) still
        ends that epoch, and its next ``iter()`` starts the next one.
        """
        self._iteration_token += 1
        base = self.sift_config.base_config
        resumed = self._resume_skip is not None
        skip = self._resume_skip or 0
        self._resume_skip = None
        if not resumed:
            self._epoch += 1
            self._consumed = 0
            if base.repeat_delay_per_epoch:
                self._delay_progress = 0
        self._epoch_in_progress = True
        # A resumed epoch plans what is left of it, so that the look-ahead of _before_yield
        # scores the trailing source batches at the same point as the uninterrupted run.
        self._epoch_planned = self._exact_epoch_plan(skip)
        self._emitted_in_epoch = 0
        return self._iterate(self._iteration_token, skip)

    def _iterate(self, token: int, skip: int) -> Iterator[Any]:
        base = self.sift_config.base_config
        source_batches = self._source_batches()
        self._epoch_source = source_batches
        self._resume_like = None
        try:
            for index, source in source_batches:
                if index < skip:  # resuming mid-epoch: these were consumed before the checkpoint
                    self._resume_like = (index, source)
                    continue
                if token != self._iteration_token:
                    raise RuntimeError("SiftingDataloader: a new iteration was started; this iterator is no longer valid")
                if self._restored is not None and self._resume_like is not None:
                    yield from self._resume_emission(*self._resume_like)
                self._resume_like = None
                if self._delay_progress < base.sift_delay:
                    self._delay_progress += 1
                    n = self._count_delayed(source, index)
                    c = self.counts
                    c.num_source_batches += 1
                    c.num_source_batches_delayed += 1
                    c.num_orig_samples_seen += n
                    c.num_orig_samples_kept += n
                    c.num_samples_emitted += n
                    c.num_batches_emitted += 1
                    self._consumed = index + 1
                    self._before_yield()
                    yield source
                    continue
                yield from self._sift_source_batch(source, index)
            if token == self._iteration_token:
                if self._restored is not None and self._resume_like is not None:
                    yield from self._resume_emission(*self._resume_like)  # every source batch was consumed
                self._resume_like = None
                if self._coordinated:  # last agreement of the epoch: every rank ends on the same count
                    yield from self._emit(self._staging is not None, time.perf_counter(), end_of_epoch=True)
                self._epoch_in_progress = False
                self._nonfinite_notice.flush()
                self._drop_notice.flush()
        finally:  # do not hold the source iterator (and its DataLoader workers) past the epoch
            if self._epoch_source is source_batches:
                self._epoch_source = None

    def _exact_epoch_plan(self, skip: int) -> Optional[int]:
        """This epoch's exact batch count (what is left of it after ``skip`` consumed source
        batches), when known in advance (fixed mode, sized source)."""
        if self.selection_mode != "fixed" or self._batch_size is None:
            return None
        try:
            return plan_epochs(self, 1, skip)[0][0]
        except TypeError:
            return None

    def _resume_emission(self, index: int, like: Any) -> Iterator[Any]:
        """Restored samples go back in before anything is scored, and the batches the
        checkpoint had ready (or agreed) are emitted first, as the uninterrupted run would
        have emitted them before scoring its next source batch with the weights of then.

        ``like``: a source batch consumed before the checkpoint, transformed only to give the
        restored samples their container types again.
        """
        try:
            transformed = self._timed("transform", self.batch_transforms.transform, like)
        except Exception as exc:
            add_context(exc, f"neuron_sift: while transforming source batch {index} of epoch {self._epoch} (resume)")
            raise
        if not isinstance(transformed, SiftingBatch) or len(transformed) == 0 or self._batch_size is None:
            return
        staged = self._uses_device_staging(transformed)
        self._reinsert_restored(transformed, staged)
        if staged:
            self._staging.bind(transformed)
        yield from self._emit(staged, time.perf_counter(), resumed=True)

    def _before_yield(self) -> None:
        """Before the epoch's last planned batch, score the source batches still left.

        They can only add pending samples (the plan is exact), but a consumer that stops
        after ``len(loader)`` batches, as Lightning and the Hugging Face Trainer do, would
        otherwise never pull them, and their samples would go unseen in this epoch.
        """
        self._emitted_in_epoch += 1
        if self._epoch_planned is None or self._emitted_in_epoch != self._epoch_planned:
            return
        self._epoch_planned = None
        for index, source in self._epoch_source:
            for _ in self._sift_source_batch(source, index, emit=False):
                pass

    def _source_batches(self) -> Iterator[Any]:
        """``enumerate(orig_dataloader)``, with a note on errors saying which batch failed.

        The source loader's own exception (its type and traceback, e.g. a worker's error
        re-raised by DataLoader) propagates unchanged apart from the note.
        """
        source = iter(self.orig_dataloader)
        index = 0
        while True:
            try:
                batch = next(source)
            except StopIteration:
                return
            except Exception as exc:
                add_context(exc, f"neuron_sift: while loading source batch {index} of epoch {self._epoch} from orig_dataloader")
                raise
            yield index, batch
            index += 1

    def _count_delayed(self, source: Any, index: int) -> int:
        try:
            return len(self._timed("transform", self.batch_transforms.transform, source))
        except Exception as exc:
            add_context(exc, f"neuron_sift: while transforming source batch {index} of epoch {self._epoch} (sift_delay)")
            raise

    def _timed(self, name: str, fn: Callable, *args):
        """Run one phase, add its host time to ``self.timings`` and log it at INFO.

        Host time: on XLA the device runs asynchronously, so a phase that reads a result
        back also waits for the device work it depends on.
        """
        start = time.perf_counter()
        out = fn(*args)
        elapsed = time.perf_counter() - start
        entry = self.timings.setdefault(name, [0.0, 0])
        entry[0] += elapsed
        entry[1] += 1
        if logger.isEnabledFor(logging.INFO):
            logger.info("func:%s latency: %.6f", name, elapsed)
        return out

    def _sift_source_batch(self, source: Any, index: int, emit: bool = True) -> Iterator[Any]:
        start = time.perf_counter()
        where = f"source batch {index} of epoch {self._epoch}"
        try:
            transformed = self._timed("transform", self.batch_transforms.transform, source)
        except Exception as exc:
            add_context(exc, f"neuron_sift: while transforming {where}")
            raise
        if not isinstance(transformed, SiftingBatch):
            raise UnsupportedDataFormatException(
                f"batch_transforms.transform must return a SiftingBatch (e.g. ListBatch, TensorBatch), "
                f"got {type(transformed).__name__}"
            )
        n = len(transformed)
        c = self.counts
        c.num_source_batches += 1
        if n == 0:
            self._consumed = index + 1
            return
        if self._batch_size is None:
            self._batch_size = n
        b = self._batch_size
        staged = self._uses_device_staging(transformed)
        if self._restored is not None:
            self._reinsert_restored(transformed, staged)
        if staged:
            # Tensor fields go to the device once (the user's own .to(device) is then a no-op);
            # a short batch is padded so the scoring forward keeps its shape.
            scored = pad_batch(batch_to_device(transformed, self.backend.device), b)
            original = scored.to_user()
        else:
            scored, original = transformed, source
        try:
            losses = self._timed("calculate_relevance_values", self._score, scored, original)
        except Exception as exc:
            add_context(exc, f"neuron_sift: while scoring {where}")
            raise
        out = self._timed("should_sift", self.sifter.step, losses, n, b)
        if staged:
            n_kept, n_nonfinite, indices = self._timed("sift", staged_selection, self, scored, out, n)
            n_held = self._holdable(n_kept)
            with self._context(f"accumulating the kept samples of {where}"):
                self._timed("accumulate", self._staged_accumulate, scored, out, n_held, indices)
        else:
            indices, n_nonfinite = self._timed("sift", self.sifter.read_selection, out)
            n_kept = indices.shape[0]
            n_held = self._holdable(n_kept)
            # The default batch takes the index tensor; a user's SiftingBatch gets Python ints.
            picked = indices[:n_held] if isinstance(transformed, DefaultSiftingBatch) else indices[:n_held].tolist()
            self._timed("accumulate", self._accumulator.add, transformed.select(picked))
        c.num_orig_samples_seen += n
        c.num_orig_samples_kept += n_kept
        c.num_orig_samples_sifted += n - n_kept
        c.num_samples_pending += n_held
        c.num_samples_dropped += n_kept - n_held
        self._consumed = index + 1
        c.num_nonfinite_losses += n_nonfinite
        self._nonfinite_notice.report(n_nonfinite, where)
        if self._coordinated:
            self._drop_notice.report(n_kept - n_held, where)
        if self.log_batch_data:  # costly: reads losses and the selection back to the host
            values = self.backend.to_host(losses.float())[:n]
            if indices is None:
                indices, _ = self.sifter.read_selection(out)
            logger.info("relevance_values: %s", values.tolist())
            kept = torch.as_tensor(indices, dtype=torch.long)
            logger.info("relevance_values_kept: %s", values[kept].tolist())
            logger.info("kept_indices: %s", kept.tolist())
        if emit:
            yield from self._emit(staged, start)

    @contextlib.contextmanager
    def _context(self, what: str):
        """Say which source batch an error of the library's own joining came from."""
        try:
            yield
        except UnsupportedDataFormatException as exc:
            add_context(exc, f"neuron_sift: while {what}")
            raise

    def _holdable(self, n_kept: int) -> int:
        """How many of ``n_kept`` newly kept samples may wait (the first ones, in source order).

        Under agreement a rank emits the minimum of the ranks' ready batches, so a rank that
        keeps more than its peers (its data is harder) would hold back ever more samples.
        Past ``max_pending`` its newest kept samples are dropped instead: counted, logged.
        """
        if not self._coordinated:
            return n_kept
        waiting = len(self._staging) if self._staging is not None else len(self._accumulator)
        return max(0, min(n_kept, self.max_pending - waiting))

    def _emission_budget(self, end_of_epoch: bool) -> Optional[int]:
        """How many full batches may be emitted now; None: every ready one.

        Uncoordinated (one process, or fixed mode, where every rank keeps the same count by
        construction) emits whatever is ready. Coordinated ranks emit only at agreement
        points, the minimum over ranks of their ready batches; the rest stays pending.
        """
        if not self._coordinated:
            return None
        if not end_of_epoch:
            self._since_sync += 1
            if self._since_sync < self._sync_every:
                return 0
        self._since_sync = 0
        ready = (len(self._staging) if self._staging is not None else len(self._accumulator)) // self._batch_size
        return self.ranks.min_int(ready)

    def _emit(self, staged: bool, start: float, end_of_epoch: bool = False, resumed: bool = False) -> Iterator[Any]:
        """Emit the ready batches (uncoordinated) or the agreed ones (coordinated).

        Coordinated, the agreed count is kept in ``_budget_left`` until every agreed batch
        is out, so a checkpoint taken between two of them resumes with the rest; ``resumed``
        emits that rest without a new agreement.
        """
        if self._batch_size is None:
            return
        if self._coordinated and not resumed:
            self._budget_left = self._emission_budget(end_of_epoch)
        budget = self._budget_left if self._coordinated else None
        c = self.counts
        while budget is None or budget > 0:
            last = f"source batch {self._consumed - 1} of epoch {self._epoch}"
            with self._context(f"joining the kept samples (the last ones from {last})"):
                batch = self._staged_pop() if staged else self._accumulator.pop(self._batch_size)
            if batch is None:
                if budget:
                    raise RuntimeError(f"internal error: {budget} agreed batches could not be cut")
                return
            if budget is not None:
                budget -= 1
                self._budget_left = budget
            out_batch = self._timed("reverse_transform", self.batch_transforms.reverse_transform, batch)
            c.num_samples_emitted += len(batch)
            c.num_samples_pending -= len(batch)
            c.num_batches_emitted += 1
            if logger.isEnabledFor(logging.INFO):
                logger.info("num_orig_samples_seen: %d", c.num_orig_samples_seen)
                logger.info("num_orig_samples_kept: %d", c.num_orig_samples_kept)
                logger.info("Batch size for next sifted batch: %d", len(batch))
                logger.info("sifted_batch_creation_latency: %.6f", time.perf_counter() - start)
            if self.log_batch_contents:  # explicit opt-in: sample contents in the log
                logger.info("emitted_batch: %r", out_batch)
            self._before_yield()
            yield out_batch
            start = time.perf_counter()

    def _uses_device_staging(self, transformed: SiftingBatch) -> bool:
        """Device staging: XLA backend with the default batch handling (see device_staging.py)."""
        if not (self.backend.gathers_on_device and isinstance(transformed, DefaultSiftingBatch)):
            return False
        if self._staging is None:
            b = self._batch_size
            m = self.sifter.fixed_keep_count(b) if self.selection_mode == "fixed" else b
            self._staging = DeviceStaging(b, self.backend, m, self.max_pending if self._coordinated else None)
        return True

    def _staged_accumulate(self, scored: DefaultSiftingBatch, out, n_kept: int, indices) -> None:
        """Stage kept rows on the device, then cut the graph (asynchronously)."""
        self._staging.add(scored, out.order, n_kept, out.count, indices)
        self.backend.after_step()

    def _staged_pop(self) -> Optional[DefaultSiftingBatch]:
        """Cut the next full batch, if one is ready, and sync.

        Batches are cut one at a time, just before they are yielded, so samples of a batch
        not yet handed out stay pending (and in ``state_dict()``). The sync turns the
        emitted batch into device data: the user's training graph never contains sifting
        ops, and the set of compiled graphs does not depend on the data.
        """
        batch = self._staging.pop()
        if batch is not None:
            self.backend.after_step()
        return batch

    def _score(self, transformed: SiftingBatch, source: Any) -> torch.Tensor:
        with scoring_mode(self.model):
            losses = self._loss_fn(self.model, transformed, source)
        return check_losses(losses, len(transformed), self.backend.device)

    # -- planning ------------------------------------------------------------------------

    def plan_epochs(self, epochs: int = 1) -> Tuple[List[int], int]:
        """Batches each of the next ``epochs`` epochs emits, and the source samples they score.

        Exact in ``fixed`` mode; the expected counts in ``probabilistic`` mode (kept share
        ``1 / (1 + beta)`` of every scored sample). Accounts for ``sift_delay`` (and its
        repetition per epoch) and for kept samples carried from one epoch into the next.
        Plans from the start of the next epoch, or, after ``load_state_dict()`` of a
        checkpoint taken mid-epoch, from where the resumed epoch continues. Raises
        ``TypeError`` when the source loader has no length.

        Args:
            epochs: how many epochs to plan (int >= 1).

        Returns:
            ``(batches, scored)``: the batches of each of the next ``epochs`` epochs, and the
            number of source samples they score.

        Raises:
            TypeError: the source loader has no length.
            ValueError: ``epochs`` is not an int >= 1.
            SiftConfigValidationException: fixed mode would keep no sample of a batch.
        """
        return plan_epochs(self, epochs, self._resume_skip or 0)

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything that decides future selections, as CPU tensors and plain values.

        Loss history and its position/fill, counters, the random state (seed and draw
        counter), delay progress, epoch progress (source batches consumed in the current
        epoch), the mode, and the kept samples not yet emitted. Loads with
        ``torch.load(path, weights_only=True)``, on either backend. Call it between batches
        (e.g. right after a training step); a run resumed from it, with the same source
        data order, emits exactly the batches the uninterrupted run would have emitted.

        Returns:
            A dict of tensors (on the CPU) and plain Python values.

        Raises:
            TypeError: pending samples of a custom ``SiftingBatch`` type other than ``ListBatch``
                or ``TensorBatch`` cannot be saved; save when ``num_pending == 0``.
        """
        return loader_state(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()``; the next iteration continues where it was taken.

        Mid-epoch, the next ``iter()`` skips the source batches the checkpoint had already
        consumed (they are still loaded, not scored), so the source loader must produce the
        same order again (e.g. a seeded sampler with ``set_epoch``). ``beta_value`` may
        differ from the checkpoint's; the selection mode and history length may not.

        Args:
            state: a dict returned by ``state_dict()`` of a loader of the same selection mode and
                history length, on this rank of the same world size.

        Raises:
            ValueError: not a ``SiftingDataloader`` state, a state of another rank or world size,
                a different selection mode or history length, or an inconsistent state.
        """
        restore_loader_state(self, state)

    def _reinsert_restored(self, transformed: SiftingBatch, staged: bool) -> None:
        """Put restored pending samples back, ahead of anything kept from now on."""
        batch = self._restored.bind(transformed)
        self._restored = None
        if staged:
            self._staging.preload(batch)  # uploaded whole when the buffers are created
        else:
            self._accumulator.add(batch)

    # -- inspection ----------------------------------------------------------------------

    @property
    def num_pending(self) -> int:
        """Kept samples waiting for a full batch (carried into the next epoch)."""
        restored = self._restored.size if self._restored is not None else 0
        return len(self._accumulator) + (len(self._staging) if self._staging is not None else 0) + restored

    def pending_batch(self) -> Optional[SiftingBatch]:
        """The kept samples not yet emitted, as one ``SiftingBatch`` (None if none).

        Right after ``load_state_dict()`` and before the first scored batch, restored
        samples have no container types yet; they are reported through the checkpoint.

        Returns:
            A ``SiftingBatch`` of the pending samples, or None when none are pending.
        """
        if self._staging is not None and len(self._staging):
            return self._staging.pending_batch()
        pieces = self._accumulator.pending()
        if not pieces:
            return None
        return pieces[0].concat(pieces[1:]) if len(pieces) > 1 else pieces[0]

    @property
    def machinery_seconds(self) -> float:
        """Host seconds in sifting's own phases so far (every timed phase but the scoring forward)."""
        return sum(v[0] for k, v in self.timings.items() if k != "calculate_relevance_values")

    def metrics(self) -> dict:
        """Counts (host) plus the device counters and history fill (one host read).

        Returns:
            A dict: the fields of ``counts``, ``history_fill``, the device counters
            (``device_num_scored``, ``device_num_kept``, ``device_num_nonfinite``), ``timings``
            (seconds and calls per phase), ``machinery_seconds`` and ``kept_share``.
        """
        out = self.counts.as_dict()
        st = self.sifter.state
        fill, scored, kept, nonfinite = self.backend.to_host(
            torch.stack([st.fill, st.num_scored, st.num_kept, st.num_nonfinite])
        ).tolist()
        out["history_fill"] = int(fill)
        out["device_num_scored"] = int(scored)
        out["device_num_kept"] = int(kept)
        out["device_num_nonfinite"] = int(nonfinite)
        # The host count misses batches whose selection was never read (fixed mode on XLA);
        # the device counter sees every scored batch.
        out["num_nonfinite_losses"] = int(nonfinite)
        out["timings"] = {k: {"seconds": v[0], "calls": v[1]} for k, v in self.timings.items()}
        out["machinery_seconds"] = self.machinery_seconds
        out["kept_share"] = (
            out["num_orig_samples_kept"] / out["num_orig_samples_seen"] if out["num_orig_samples_seen"] else 0.0
        )
        return out
