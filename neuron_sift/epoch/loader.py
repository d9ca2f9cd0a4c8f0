"""``EpochSiftingDataloader``: epoch-level sifting from the losses training already computes.

Why at the sampler: a skipped sample that is never loaded nor forwarded is where the time
is saved, and the losses that rank samples come free with the training step. So each
epoch is planned at its start from every sample's most recent training loss, the user's
own DataLoader settings deliver the plan's samples through a batch sampler of ours, and
``weighted_loss(per_sample)`` pairs the losses with their samples, records them as scores
and returns the weighted mean whose expectation is the full-data loss. No scoring
forward, no patching.

This object keeps the arguments, the lengths and the state API; each job is a part with its
own ``state_dict`` (``docs/architecture.md``), the checkpoint their composition (``resuming/``).
"""

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from neuron_sift.backends import BACKEND_NAMES, resolve_backend
from neuron_sift.backends.base import Backend
from neuron_sift.epoch.planning.plan import EpochPlan, PlanSettings
from neuron_sift.epoch.planning.planned_counts import check_planned_counts
from neuron_sift.epoch.planning.rank_settings import agreed_settings, plan_seed
from neuron_sift.epoch.resuming.loader_state import EpochParts
from neuron_sift.epoch.resuming.run_states import own_state, resume_from_ranks
from neuron_sift.epoch.resuming.state_layout import STATE_VERSION
from neuron_sift.epoch.running.history import EpochHistory
from neuron_sift.epoch.running.loader_metrics import epoch_report
from neuron_sift.epoch.running.opening import EpochOpener
from neuron_sift.epoch.running.pairing import PairingQueue
from neuron_sift.epoch.running.progress import EpochProgress
from neuron_sift.epoch.running.recording import LossRecorder
from neuron_sift.epoch.score_table import score_table
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.epoch.selection.guard import NoiseGuard
from neuron_sift.epoch.selection.reference_scores import ReferenceScores, load_reference, reference_identity
from neuron_sift.epoch.selection.start_rule import StartRule
from neuron_sift.epoch.user_data.sampling import read_sampling
from neuron_sift.epoch.user_data.source_loader import PlannedBatchSampler, inspect_source, rebuild
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.validation import positive_int
from neuron_sift.sift_config.epoch_config import coerce_epoch_config

__all__ = ["EpochSiftingDataloader", "STATE_VERSION"]


class EpochSiftingDataloader:
    """Yields the user's own batches of the samples each epoch's plan keeps.

    Args:
        sift_config: an ``EpochSiftConfig`` or an equivalent dict.
        orig_dataloader: a ``torch.utils.data.DataLoader`` over a map-style dataset with a
            length and a batch size (a Hugging Face ``datasets.Dataset``, or an
            ``IterableDataset`` that also reads by index, such as MosaicML Streaming's
            ``StreamingDataset``: ``user_data/source_loader.py``), or wrappers around one (torch-xla's
            ``MpDeviceLoader``, accelerate's prepared loaders). Its settings are kept; its sampling is replaced
            by the plan, which draws only from the samples its sampler can yield
            (``user_data/sampling.py``).
        num_epochs: the run's length in epochs (int >= 1), needed for annealing and
            ``planned_steps()``; None: no annealing epochs.
        backend: one of ``neuron_sift.backends.BACKEND_NAMES`` (``"eager"``, ``"compiled"``,
            ``"xla"``), or None to follow the device of the losses, as in ``SiftingDataloader``.
        distributed: None follows ``torch.distributed``; True or False forces it.
        device: where the score tables live (also the collective device for nccl); None
            places them with the first losses passed to ``weighted_loss``.
        lookahead: the most batches the training loop holds yielded but without their losses
            (an int >= 1), or None to learn it from the loop (see ``skip_batch``): give it when
            a wrapper around the loader prefetches a varying number of batches.
        reference: a ``ReferenceTable`` (or its folder) of this dataset: plans rank excess loss,
            and minus the reference loss before any score (``selection/reference_scores.py``).

    Iterating yields the source loader's own batches, of the samples the epoch's plan keeps,
    in the plan's order. Pass each batch's per-sample losses to ``weighted_loss``.

    Raises:
        SiftConfigValidationException: the config is invalid.
        TypeError: the source is not a DataLoader over a dataset with a length and a batch size,
            or its sampler is a ``WeightedRandomSampler`` or yields something other than indices.
        ValueError: an empty dataset, ``num_epochs`` or ``lookahead`` not an int >= 1, an
            unknown backend, or a sampler a plan cannot honour (with replacement, repeated or
            out-of-range indices, another world size: ``user_data/sampling.py``), or settings that differ
            between ranks (every rank raises, naming each: ``planning/rank_settings.py``).
    """

    def __init__(
        self,
        sift_config: Any,
        orig_dataloader: Any,
        num_epochs: int | None = None,
        *,
        backend: str | None = None,
        distributed: bool | None = None,
        device: Any | None = None,
        lookahead: int | None = None,
        reference: Any = None,
    ) -> None:
        self.sift_config = coerce_epoch_config(sift_config)
        self.num_epochs = positive_int(num_epochs, "num_epochs", allow_none=True)
        if backend is not None and backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES} or None, got {backend!r}")
        self._backend_name = backend
        self.orig_dataloader = orig_dataloader
        self._info = inspect_source(orig_dataloader)
        self.n = self._info.n
        dev = torch.device(device) if device is not None else None
        self.ranks = RankGroup(distributed, dev if dev is not None else torch.device("cpu"))
        # The samples the user's sampler can yield, and its order: plans never widen them.
        self.sampling = read_sampling(self._info.dataloader, self.n, self.ranks.world_size)
        table, self.sift_config = load_reference(reference, self.sift_config)  # checked once the ranks agree
        run = PlanSettings(  # what decides the plans: the same on every rank, before each takes its place in them
            config=self.sift_config,
            n=self.n,
            batch_size=self._info.batch_size,
            drop_last=self._info.drop_last,
            seed=plan_seed(self.sift_config, self._info.generator_seed),
            num_epochs=num_epochs,
            support=self.sampling.support,
            ordered=self.sampling.ordered,
            reference=reference_identity(table),
        )
        settings = agreed_settings(run, self.ranks)  # one all-gather: refused on every rank where they differ
        self.score_table = score_table(self.sift_config.score_table)
        parts = self.score_table.build(settings, self.ranks)
        self.planner, self.shares = parts.planner, parts.shares
        check_planned_counts(self.planner)  # after the settings agreement: every rank refuses together
        self.tables = ScoreTables(self.planner.table_size, self.sift_config.score_smoothing)
        self.backend: Backend | None = None
        if dev is not None:
            self._place(dev)
        self.pairing = PairingQueue(lookahead)
        self.guard = NoiseGuard(self.sift_config, self.planner.table_size, self.planner.score_quantile)
        self.start = StartRule(
            self.sift_config, self.planner.owned_entries, self.planner.score_percentiles, self.planner.sum_over_ranks
        )
        # The record of epochs, read as the list of its entries; kept shares are of the samples plans draw from.
        self.history = EpochHistory(self.planner.m)
        self._sampler = PlannedBatchSampler()
        self._loader = rebuild(orig_dataloader, self._info, self._sampler)
        ranking = None if table is None else ReferenceScores(table, self.planner, self._info.dataloader.dataset)
        self.opener = EpochOpener(self.planner, self.tables, self.shares, self.guard, self.start, self.history, ranking)
        self.progress = EpochProgress(self._loader, self._sampler, self.planner, self.opener, self.pairing)
        self.recorder = LossRecorder(
            self.pairing, self.planner, self.tables, self.shares, self.progress, self.history, self._backend_for
        )
        self._parts = EpochParts(
            self.planner,
            self.progress,
            self.tables,
            self.shares,
            self.guard,
            self.start,
            self.pairing,
            self.history,
            self.opener,
            self.score_table.check_shares,
        )

    # -- properties ----------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self._info.batch_size

    @property
    def seed(self) -> int:
        """The seed of every plan's order and draws (the config's, the source's generator's,
        or ``torch.initial_seed()``)."""
        return self.planner.seed

    @property
    def epoch(self) -> int:
        """Epochs started so far (the current epoch is ``epoch - 1``, 0-based)."""
        return self.progress.epochs_started

    @property
    def plan(self) -> EpochPlan | None:
        """The current (or last) epoch's plan."""
        return self.progress.plan

    @property
    def resuming(self) -> bool:
        """Whether the next ``iter()`` continues a checkpoint's epoch in progress."""
        return self.progress.resuming

    @property
    def counts(self) -> dict[str, int]:
        """Losses and batches recorded, batches skipped (``skip_batch``), batches yielded."""
        return self.pairing.counts

    @property
    def timings(self) -> dict[str, dict[str, float]]:
        """Host seconds and calls of each phase (``planning``, ``weighted_loss``), as the
        per-batch loader's ``metrics()["timings"]``."""
        return self.history.timings.as_dict()

    @property
    def length_is_exact(self) -> bool:
        """Whether ``len()`` and ``planned_steps()`` are exact before each epoch starts: with a
        budget (``kept_share``) and without the start rule (which decides at each sifted
        epoch's opening whether it prunes), or when no epoch of ``num_epochs`` is sifted."""
        if not self.planner.sifts():
            return True
        return self.sift_config.has_budget and self.sift_config.start_rank_correlation is None

    def __len__(self) -> int:
        """This rank's batches of the current epoch while it runs (the remaining ones when a
        resume is pending); otherwise of the next epoch (exact for full and budgeted epochs,
        the expected count for an unbudgeted sifted epoch)."""
        known = self.progress.known_length()
        return known if known is not None else self.planner.epoch_batches(self.progress.epochs_started)

    def planned_steps(self, epochs: int | None = None) -> int:
        """Batches (optimizer steps without accumulation) this rank trains from now on: the rest
        of an epoch in progress plus the next epochs, up to ``num_epochs``, or ``epochs`` epochs
        (an int >= 1; the one in progress counted first). Exact with a budget; for unbudgeted
        sifted epochs the expected count (the config's expected share, in whole batches as the
        planner rounds). ``ValueError`` without ``num_epochs`` or ``epochs``, or for a bad ``epochs``."""
        progress = self.progress
        return self.planner.steps_left(
            progress.epochs_started, progress.left_in_current(), epochs, open_epoch=progress.is_open()
        )

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """A new epoch, planned at the first ``next()`` (or by ``start_epoch()``), or the one
        in progress after ``load_state_dict()``. The previous epoch's batches without losses
        are forgotten (``metrics()["unpaired_batches"]``, with a warning). An iterator never
        advanced plans nothing (Lightning's check), and an epoch is spent once a loss of it is
        recorded: after a peek the next ``iter()`` runs the same plan from its start; after a
        ``break`` it plans the next epoch, warning how many batches were never trained."""
        return self.iter_epoch()

    def start_epoch(self) -> EpochPlan:
        """Plan the next epoch now and return its ``EpochPlan`` (``len()`` and ``plan`` then
        describe it); the next ``iter()`` runs it. Does nothing if an epoch is already planned
        and no loss of it was recorded yet (planned ahead, peeked at, or a checkpoint's)."""
        return self.progress.start_epoch()

    def iter_epoch(self, carry_pending: bool = False) -> Iterator[Any]:
        """``iter(loader)``; with ``carry_pending=True`` the previous epoch's batches still
        waiting for their losses stay first in line: for wrappers that prefetch across
        epochs (``integrations.schedules.ExactLengthLoader``)."""
        return self.progress.iterate(carry_pending)

    # -- the loss ------------------------------------------------------------------------

    def _place(self, device: torch.device) -> Backend:
        self.backend = resolve_backend(device, self._backend_name)
        self.tables.place(self.backend)
        return self.backend

    def _backend_for(self, device: torch.device) -> Backend:
        """The backend, placed on ``device`` with the first losses."""
        return self.backend or self._place(device)

    def weighted_loss(self, per_sample: torch.Tensor, *, partial: bool = False) -> torch.Tensor:
        """Record ``per_sample`` (one loss per sample of the oldest batch still waiting) as the
        samples' scores and return the weighted mean ``sum(w_i * l_i) / n``.

        Args:
            per_sample: ``[n]`` (or ``[n, 1]``) floating losses, ``reduction="none"``, any
                precision (bf16/fp16 upcast to float32). Non-finite losses are not recorded
                (counted in ``metrics()``) and stay in the returned mean, as without sifting.
            partial: the losses are a micro-batch, the next ``n`` samples of the waiting batch
                in order; the value returned is then its share of the batch's,
                ``sum(w_i * l_i) / n_batch``: the parts sum to the batch's weighted mean.

        Returns:
            A 0-dim tensor to call ``backward()`` on; its expectation over the epoch's draws is
            the full-data mean loss.

        Raises:
            LossOutputException: a wrong shape, length, dtype or device, or no yielded batch is
                waiting (``running/pairing.py``).
        """
        return self.recorder.weighted(per_sample, partial)

    def weighted_batch_loss(self, batch_loss: torch.Tensor) -> torch.Tensor:
        """For a loss with no per-sample value (InfoNCE, other contrastive losses): score every
        sample of the oldest waiting batch by the moving average of the batch losses (0-dim) it
        appeared in, and return ``batch_loss`` times the batch's mean loss weight: an
        approximation (``running/recording.py``).

        Raises:
            LossOutputException: not a 0-dim floating tensor, another device than the tables',
                or no yielded batch is waiting.
        """
        return self.recorder.weighted_batch(batch_loss, self.sift_config.score_smoothing)

    def skip_batch(self) -> None:
        """Leave the oldest batch still waiting for its losses out: it gets none (its samples
        keep their previous scores, the rest of a micro-batched one too), it counts as done
        for the epoch's position and a checkpoint, and ``counts["batches_skipped"]`` counts it.

        Call it where the loop moves past a batch without ``weighted_loss`` (a non-finite loss
        it will not step on, a batch it filters out): ``loader.skip_batch(); continue``. Why:
        the losses carry no ids, so the next call would pair with the skipped batch's samples
        (``running/pairing.py`` catches that at the next yield, before any loss is misplaced).

        Raises:
            LossOutputException: no yielded batch is waiting.
        """
        self.recorder.skip()

    # -- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the rest of the run, as CPU tensors and plain values (loads
        with ``torch.load(weights_only=True)``): each part's own state under its name, plus
        the version (layout: ``neuron_sift/epoch/resuming/state_layout.py``). Take it between training
        steps: a run resumed from it continues with the first batch whose losses were not
        recorded, with the same remaining batches, scores and draws."""
        return self._parts.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (this version's, or version 1's, converted); the next
        ``iter()`` continues where it was taken.

        Args:
            state: a dict returned by ``state_dict()`` of a loader with the same settings.

        Raises:
            ValueError: not an ``EpochSiftingDataloader`` state, a version this code does not
                read, or one taken with other settings.
        """
        self._parts.load_state_dict(state)

    def load_state_dict_from_ranks(self, states: Sequence[dict[str, Any]]) -> None:
        """Restore from every rank's ``state_dict()`` of the run, taken at one step with any
        number of ranks: at this loader's world size each rank's own state is loaded (the
        exact resume); at another, they are combined into this rank's share of the same run
        (``neuron_sift/epoch/resuming/``: ``replicated_reshard.py``, ``sharded_reshard.py``): the
        epoch in progress continues with its rest dealt out to the ranks now present, nothing
        trained twice or left out, and later epochs are planned for this world size.

        Raises:
            ValueError: not every rank's state of one run at one step, or an epoch in
                progress with fewer samples left than ranks.
        """
        own = own_state(states, self.planner)  # at this world size: this rank's, the states checked to be at one step
        if own is None:
            own = resume_from_ranks(states, self.planner, self.score_table.check_shares, self.score_table.resume)
        self.load_state_dict(own)

    # -- inspection ----------------------------------------------------------------------

    @property
    def machinery_seconds(self) -> float:
        """Host seconds in planning and ``weighted_loss`` (its weighted mean included)."""
        return self.history.machinery_seconds

    def metrics(self) -> dict[str, Any]:
        """Counts, the current plan and the table (one host read of the scores on a device):
        ``report.epoch_report``. ``observed_kept_share`` is the share the current epoch
        trains."""
        return epoch_report(self.history, self.progress, self.pairing, self.tables)
