"""``SiftingDataloader``: wraps a DataLoader and yields full batches of kept samples.

The loader object keeps the arguments (checked in ``loader_arguments.py``), ``len`` and the
state API; its parts do the work, each with one job and its own ``state_dict``: the pass
over the source, one per epoch (``sifting_pass.py``: look-ahead, scoring, emission; what
is delayed, carried over or dropped), its position (``parts.PassPosition``), the engine
(``engine.Sifter``: the loss history and the selection step), the backend's pending store
(``backends/pending.py``), the data-parallel agreement (``agreement.py``), the delay
(``delay.py``) and the counts (``sifting_counts.py``). The checkpoint is their composition
plus a version (``loader_checkpoint.py``); the batches a pass will emit are counted ahead
in ``batch_counts.py``. These see the loader through ``parts.SiftingParts``.
"""

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from neuron_sift.backends import resolve_backend
from neuron_sift.backends.base import model_device
from neuron_sift.backends.pending import PendingStore
from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.default_batch import DefaultBatchTransform
from neuron_sift.data_model.default_sifting_batch import DefaultSiftingBatch
from neuron_sift.dataloader import loader_arguments as arguments
from neuron_sift.dataloader.agreement import EmissionAgreement
from neuron_sift.dataloader.batch_counts import check_yields_a_batch, exact_pass_length, plan_loader
from neuron_sift.dataloader.batch_scorer import BatchScorer
from neuron_sift.dataloader.delay import SiftDelay
from neuron_sift.dataloader.loader_checkpoint import loader_state, restore_loader_state
from neuron_sift.dataloader.notices import drop_notice, nonfinite_notice
from neuron_sift.dataloader.parts import PassPosition, new_pending_store
from neuron_sift.dataloader.payback import PaybackCheck
from neuron_sift.dataloader.rank_settings import check_same_on_every_rank
from neuron_sift.dataloader.sample_ids import SampleIds
from neuron_sift.dataloader.sifting_counts import SiftingCounts
from neuron_sift.dataloader.sifting_pass import SiftingPass
from neuron_sift.engine.sifter import Sifter
from neuron_sift.loss.abstract_sift_loss_module import resolve_loss_fn
from neuron_sift.scoring.reference_table import as_reference_table
from neuron_sift.shared.counts import PhaseTimings
from neuron_sift.shared.iterators import IteratorGeneration
from neuron_sift.shared.logs import LOADER_LOGGER
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.sources import first_batch_size, underlying_dataloader
from neuron_sift.sift_config.sift_configs import coerce_sift_config

logger = logging.getLogger(LOADER_LOGGER)

__all__ = ["SiftingCounts", "SiftingDataloader"]


class SiftingDataloader:
    """Wraps ``orig_dataloader``; yields batches of ``batch_size`` high-loss samples.

    Arguments as in smart_sifting, plus neuron_sift's keyword-only ones (``backend``,
    ``log_batch_contents``, ``distributed``, ``max_pending``). The library writes nothing
    to disk or network: logs go to the ``logging`` handlers you configure.

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
            rank keeps pending (None: four batches); newly kept samples beyond it are dropped and
            counted.
        scoring_model: a module that scores instead of ``model`` (a smaller one: the scoring
            forward is per-batch sifting's cost), on the model's device; ``scoring_optimizer``:
            its optimizer, to train it one step on each yielded batch (``batch_scorer.py``).
        reference: a ``ReferenceTable`` or a folder written by ``score_dataset``: the reference
            losses the config's ``criterion`` ``"excess"`` or ``"reference"`` reads by sample id.
        sample_ids: a function of a source batch returning its dataset indices, for a source
            with no sampler to read them from (``sample_ids.py``).

    Iterating yields batches of exactly ``batch_size`` kept samples in the source loader's own
    format (through ``reverse_transform`` when a transform is given).

    Raises:
        SiftConfigValidationException: the config is invalid (at construction), or fixed mode
            would keep no sample of a batch (at the first batch).
        LossImplementationNotProvidedException: ``loss_impl`` is missing or has no usable
            ``loss`` method.
        TypeError: ``orig_dataloader`` is not iterable, ``model`` is not a module, or an
            argument has the wrong type.
        ValueError: an unknown backend or one the model's device cannot run, or other settings on other ranks.
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
        model: torch.nn.Module | None = None,
        log_batch_data: bool = False,
        batch_format_index: int | None = None,
        *,
        backend: Any | None = None,
        log_batch_contents: bool = False,
        distributed: bool | None = None,
        max_pending: int | None = None,
        scoring_model: torch.nn.Module | None = None,
        scoring_optimizer: torch.optim.Optimizer | None = None,
        reference: Any = None,
        sample_ids: Callable[[Any], Any] | None = None,
    ):
        self.sift_config = coerce_sift_config(sift_config)
        self.orig_dataloader = arguments.check_source(orig_dataloader)
        self.loss_impl = loss_impl
        self.loss_fn: Callable[..., Any] = resolve_loss_fn(loss_impl)
        self.model = arguments.check_model(model)
        arguments.check_flags(log_batch_data=log_batch_data, log_batch_contents=log_batch_contents)
        self.log_batch_data = log_batch_data
        self.log_batch_contents = log_batch_contents
        self._planning_loader = underlying_dataloader(orig_dataloader)
        self._batch_size: int | None = arguments.nominal_batch_size(self._planning_loader)
        self.batch_transforms = arguments.batch_transform_for(
            batch_transforms, self._planning_loader, self._batch_size, batch_format_index
        )
        self.batch_format_index = batch_format_index
        self.backend = resolve_backend(model_device(self.model), backend)
        table = as_reference_table(reference)
        if sample_ids is not None and table is None:
            raise ValueError("sample_ids= gives the ids a reference table is read by: pass reference= too, or drop it")
        self.sample_ids = SampleIds(orig_dataloader, sample_ids) if table is not None else None
        self.source = self.sample_ids.source if self.sample_ids is not None else orig_dataloader  # what passes read
        scorer = (scoring_model, scoring_optimizer, table, self.sample_ids)
        self.scorer = BatchScorer(self.sift_config, self.model, self.loss_fn, self.backend, *scorer)
        self.payback = PaybackCheck(self.backend, self.sift_config.expected_kept_share())
        self.ranks = RankGroup(distributed, self.backend.device)
        self.counts = SiftingCounts()
        self.sifter = Sifter(self.sift_config, self.backend, self.ranks)
        # The parts, each with its own state_dict (loader_checkpoint.py composes them).
        coordinated = self.ranks.active and self.sift_config.selection_mode == "probabilistic"
        self.agreement = EmissionAgreement(self.ranks, coordinated, self.sift_config.beta_value, max_pending)
        check_same_on_every_rank(self.sift_config, self._planning_loader, self._batch_size, max_pending, self.ranks)
        check_yields_a_batch(self._planning_loader)  # after the agreement: every rank refuses together
        base = self.sift_config.base_config
        self.delay = SiftDelay(base.sift_delay, base.repeat_delay_per_epoch)
        self.pending: PendingStore | None = None  # made by the backend at the first scored batch
        self.position = PassPosition()
        self._resume = False  # load_state_dict() of a checkpoint taken mid-epoch: the next iter() continues it
        self.iterations = IteratorGeneration("SiftingDataloader")
        self.nonfinite_notice, self.drop_notice = nonfinite_notice(logger), drop_notice(logger)
        self.phases = PhaseTimings(logger)
        # Host seconds and calls per phase: transform, calculate_relevance_values (the
        # user's scoring forward), should_sift, sift, accumulate, reverse_transform.
        self.timings = self.phases.entries

    # -- public properties -------------------------------------------------------------

    @property
    def batch_size(self) -> int | None:
        """Size of every emitted batch: the source loader's batch size (or its first batch's)."""
        return self._batch_size

    @property
    def sifter(self) -> Sifter:
        """The engine: the loss history, its counters and the selection step."""
        return self._sifter

    @sifter.setter
    def sifter(self, sifter: Sifter) -> None:
        self._sifter = sifter
        # The engine's counter is the one source of the non-finite count. A bound method of
        # the engine, not of the loader: no cycle, so a dropped loader (and its device
        # tensors, which on XLA would join the next graph cut) is freed at once.
        self.counts.bind_nonfinite(sifter.num_nonfinite)

    @property
    def selection_mode(self) -> str:
        return self.sift_config.selection_mode

    @property
    def epoch(self) -> int:
        """Epochs started (as the epoch loader's ``epoch``): during the first, 1; the current
        epoch's 0-based index, the one in the log lines and notes, is ``epoch - 1``."""
        return self.position.epoch

    @property
    def max_pending(self) -> int | None:
        """The most kept samples a rank keeps pending under data-parallel agreement
        (probabilistic mode); None until the batch size is known."""
        return self.agreement.max_pending(self._batch_size)

    def __len__(self) -> int:
        """Batches the next epoch emits (after ``load_state_dict()`` mid-epoch: the rest of the
        resumed one): exact in ``fixed`` and ``topk`` modes, the expected count
        (``plan_epochs``) in ``probabilistic``, so a schedule or a Trainer sized from it ends
        near its planned end. ``TypeError`` when the source loader has no length."""
        return self.estimated_length()

    def estimated_length(self) -> int:
        """Expected number of batches of the next epoch (exact in ``fixed`` mode)."""
        return self.plan_epochs(1)[0][0]

    @property
    def length_is_exact(self) -> bool:
        """Whether ``len(loader)`` is meant as an exact count rather than an expectation: True
        in fixed mode, which keeps a known number of every source batch. Read from the
        selection mode alone: the count is exact only when the source yields the batches its
        sampler plans (as a DataLoader over a sized dataset does), which is not checked here."""
        return self.sift_config.keeps_exact_count

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """Start the next epoch (or continue a resumed one).

        The epoch starts here, not at the first ``next()``: a consumer that takes
        ``len(loader)`` batches of a resumed epoch with nothing left (``len() == 0``) still
        ends that epoch, and its next ``iter()`` starts the next one.
        """
        skip = self.position.consumed if self._resume else 0
        if not self._resume:
            self.position = PassPosition(self.position.epoch + 1, True, 0)
            self.delay.new_epoch()
        self._resume = False
        planned = exact_pass_length(self, self._planning_loader, skip)
        return SiftingPass(self, self.iterations.start(), self.position, skip, planned)

    def pending_store_for(self, batch: SiftingBatch) -> PendingStore:
        """The pending store, made by the backend for this kind of batch at the first scored one."""
        if self._batch_size is None:
            self._batch_size = len(batch)
        if self.pending is None:
            self.pending = new_pending_store(self, isinstance(batch, DefaultSiftingBatch))
        return self.pending

    # -- planning ------------------------------------------------------------------------

    def plan_epochs(self, epochs: int = 1) -> tuple[list[int], int]:
        """Batches each of the next ``epochs`` epochs emits, and the source samples they score.

        Exact in ``fixed`` mode; the expected counts in ``probabilistic`` mode (the config's
        ``expected_kept_share()`` of every scored sample). Accounts for ``sift_delay`` (and its
        repetition per epoch) and for kept samples carried from one epoch into the next.
        Plans from the start of the next epoch, or, after ``load_state_dict()`` of a
        checkpoint taken mid-epoch, from where the resumed epoch continues.

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
        return plan_loader(self, self._planning_loader, epochs, self.position.consumed if self._resume else 0)

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything that decides future selections, as CPU tensors and plain values.

        Loss history and its position/fill, counters, the random state (seed and draw
        counter), delay progress, epoch progress (source batches consumed in the current
        epoch), the mode, and the kept samples not yet emitted: each part's own state under
        its name, with a format version. Loads with ``torch.load(path, weights_only=True)``,
        on either backend. Call it between batches (e.g. right after a training step); a run
        resumed from it, with the same source data order, emits exactly the batches the
        uninterrupted run would have emitted.

        Raises:
            TypeError: pending samples of a custom ``SiftingBatch`` type other than ``ListBatch``
                or ``TensorBatch`` cannot be saved; save when ``num_pending == 0``.
        """
        return loader_state(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()``; the next iteration continues where it was taken. Mid-epoch, the next ``iter()`` skips the source batches the checkpoint had already
        consumed (they are still loaded, not scored), so the source loader must produce the
        same order again (e.g. a seeded sampler with ``set_epoch``). ``beta_value`` may
        differ from the checkpoint's (it shapes only the keep probabilities from then on, and
        how often data-parallel ranks agree: every saved part stays valid under any beta), and
        a warning names both values; the selection mode, history length and batch size may
        not.
        Checkpoints of every earlier format version load. The scoring model and its optimizer
        are the user's to save and restore, as the model is.

        Args:
            state: a dict returned by ``state_dict()`` of a loader of the same selection mode and
                history length, on this rank of the same world size.

        Raises:
            ValueError: not a ``SiftingDataloader`` state (or of an unknown version), a state of
                another rank or world size, a different selection mode, history length or batch
                size, or an inconsistent state.
        """
        restore_loader_state(self, state)
        self.iterations.void_all()
        self._resume = self.position.in_progress

    def restore_pending(self, batch_size: int | None, pending: PendingStore | None) -> None:
        """Part of ``load_state_dict``: the batch size and the store holding the checkpoint's
        pending samples (``parts.restored_pending_store``, made before any part loaded)."""
        self._batch_size = batch_size
        if batch_size is not None and isinstance(self.batch_transforms, DefaultBatchTransform):
            self.batch_transforms.nominal_batch_size = first_batch_size(self._planning_loader, batch_size)
        self.pending = pending

    # -- inspection ----------------------------------------------------------------------

    @property
    def num_pending(self) -> int:
        """Kept samples pending until a full batch (carried into the next epoch)."""
        return len(self.pending) if self.pending is not None else 0

    def pending_batch(self) -> SiftingBatch | None:
        """The kept samples not yet emitted, as one ``SiftingBatch`` (None if none). Right after
        ``load_state_dict()`` and before the first scored batch, restored samples have no
        container types yet; they are reported through the checkpoint."""
        return self.pending.pending_batch() if self.pending is not None else None

    @property
    def machinery_seconds(self) -> float:
        """Host seconds in sifting's own phases so far (every timed phase but the scoring forward)."""
        return self.phases.machinery_seconds

    def metrics(self) -> dict:
        """Counts (host) plus the device counters and history fill (one host read): the fields
        of ``counts``, ``history_fill``, ``device_num_scored``, ``device_num_kept``,
        ``device_num_nonfinite``, ``timings`` (seconds and calls per phase),
        ``machinery_seconds``, ``payback`` (``payback.py``'s report, None until measured) and
        ``observed_kept_share`` (kept / seen so far)."""
        fill, scored, kept, nonfinite = self.sifter.read_counters()
        out: dict[str, Any] = self.counts.as_dict(nonfinite)
        out.update(history_fill=fill, device_num_scored=scored, device_num_kept=kept, device_num_nonfinite=nonfinite)
        out["timings"] = self.phases.as_dict()
        out["payback"] = self.payback.report
        out["machinery_seconds"] = self.machinery_seconds
        out["observed_kept_share"] = self.counts.observed_kept_share
        return out
