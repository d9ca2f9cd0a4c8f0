"""``ExactLengthLoader``: epochs of exactly ``len()`` batches over either loader's stream of passes.

Why: a trainer or a schedule sized from ``len()`` needs every epoch to be that long, and a
sifted pass is not (probabilistic counts, the delay and carried samples in the per-batch
mode; plans that change from epoch to epoch in the epoch mode). Reading the passes as one
continuous stream cut into equal epochs makes the length exact without dropping or
repeating a batch. One class for both modes, so there is one state and one lifetime rule.

Import it from ``neuron_sift.integrations.schedules`` (its documented path).
"""

import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.integrations.exact_length_state import (
    EPOCH_STREAM_FORMAT,
    STATE_FORMAT,
    check_world_size,
    closed_epoch,
    read_state,
    resized_steps,
    same_step,
    saved_rank,
)
from neuron_sift.integrations.passes import passes_of, sifting_loader_of
from neuron_sift.shared.iterators import IteratorGeneration
from neuron_sift.shared.logs import LOADER_LOGGER
from neuron_sift.shared.sources import underlying_dataloader
from neuron_sift.shared.state_checks import need_int
from neuron_sift.shared.validation import positive_int

logger = logging.getLogger(LOADER_LOGGER)

__all__ = ["EPOCH_STREAM_FORMAT", "STATE_FORMAT", "ConsumerEpochs", "ExactLengthLoader", "closed_epoch", "read_state"]


class ConsumerEpochs:
    """``ExactLengthLoader.sampler``: no sampler of samples, the object Lightning tells the
    index of each epoch it starts (it calls ``set_epoch`` on a loader's ``sampler``, PyTorch
    samplers' convention), passed on to ``ExactLengthLoader.set_epoch``. Holds the stream
    weakly: no reference cycle keeps a dropped stream (and its loader's device tensors) alive."""

    def __init__(self, stream: "ExactLengthLoader") -> None:
        self._stream = weakref.ref(stream)

    def set_epoch(self, epoch: int) -> None:
        stream = self._stream()
        if stream is not None:
            stream.set_epoch(epoch)


class ExactLengthLoader:
    """Every epoch yields exactly ``len(self)`` batches of a ``SiftingDataloader`` or an
    ``EpochSiftingDataloader``, in either selection mode.

    Reads the loader's batches as one continuous stream of passes (a pass of the per-batch
    loader is one epoch over the source data, a pass of the epoch loader one planned epoch):
    an epoch takes the next ``steps_per_epoch`` batches, continuing the current pass or
    starting a new one when the current pass is used up. Nothing is dropped or repeated,
    and no pass is cut short: an epoch that ends mid-pass leaves the rest of the pass to the
    next epoch. An epoch abandoned by its consumer is continued by the next one.

    ``steps_per_epoch`` defaults to the planned batches of ``epochs`` passes divided by
    ``epochs``: rounded half up for the per-batch loader (so ``epochs`` epochs take
    ``epochs * len()`` batches, within ``epochs / 2`` of the plan, and a schedule built from
    ``len(loader) * epochs`` ends exactly at its planned end), rounded down for the epoch
    loader (its plan is exact: the stream never runs past the planned epochs). Around an
    epoch loader built with ``num_epochs``, ``epochs`` (when it sizes the epochs) must be
    that number: the plan places its annealing epochs at its end, and epochs beyond it
    would train on all data. Each new
    pass of the per-batch loader calls ``set_epoch(pass_index)`` on the source loader (or its
    sampler) when it has one, so a shuffling sampler reshuffles per pass; the epoch loader
    is iterated with ``iter_epoch(carry_pending=True)`` (a consumer may still hold batches
    of the previous epoch), and the end of each of this view's epochs is the end of an
    iteration for its pairing of losses (a loss that arrives after it does not tell the
    consumer's look-ahead).

    An empty source loader gives ``len() == 0`` (and epochs that yield nothing); with an
    explicit ``steps_per_epoch`` an epoch over an empty source raises ``RuntimeError``
    instead of yielding fewer batches than ``len()``.

    ``state_dict()`` / ``load_state_dict()`` hold the loader's state, the passes started,
    the epochs its consumers started, and where the current epoch and pass stand (a state
    of 0.4.0's ``EpochStream`` also loads); resumed with the same source order, it yields
    exactly the batches of the uninterrupted run. As with the loaders, resume the epoch you
    were in: its first iteration yields the rest of that epoch (``len()`` says how many).
    A state taken after an epoch's last batch resumes into that epoch's empty rest, unless
    the consumer announces the next epoch first, ``set_epoch(e + 1)`` (0-based, the epoch
    it starts), as Lightning (through ``sampler.set_epoch``) and the Hugging Face Trainer
    do: the restored epoch is then closed and the next one starts. Around an epoch loader,
    ``load_state_dict_from_ranks`` resumes every rank's states at another world size. A
    newer ``iter()`` (or ``load_state_dict()``) voids the iterators handed out before it.

    Raises:
        TypeError: ``loader`` is no sifting loader.
        ValueError: ``steps_per_epoch`` is not an int >= 1, or ``epochs`` differs from the
            epoch loader's ``num_epochs``.
    """

    length_is_exact = True

    def __init__(self, loader: Any, steps_per_epoch: int | None = None, *, epochs: int = 1):
        self.loader = sifting_loader_of(loader)
        positive_int(epochs, "epochs")
        planned = getattr(self.loader, "num_epochs", None)
        if steps_per_epoch is None and planned is not None and epochs != planned:
            raise ValueError(
                f"ExactLengthLoader(epochs={epochs}) around an EpochSiftingDataloader planned for num_epochs={planned}: "
                f"{'the epochs past its plan would train on all data' if epochs > planned else 'its plan would be cut before its annealing epochs'}. "
                f"Give both the run's number of epochs: EpochSiftingDataloader(..., num_epochs={epochs}) or "
                f"ExactLengthLoader(loader, epochs={planned})"
            )
        self._passes = passes_of(self.loader)
        self.epochs = epochs  # the consumer's epochs, when they size the epochs
        self._sized_by_epochs = steps_per_epoch is None
        if steps_per_epoch is None:
            steps_per_epoch = self._passes.default_steps(epochs)  # 0 for an empty source
        else:
            positive_int(steps_per_epoch, "steps_per_epoch")
        self.steps_per_epoch = steps_per_epoch
        self.passes = 0  # passes started so far
        self.epochs_started: int | None = 0  # epochs its consumers started (None: restored from a state without it)
        self.sampler = ConsumerEpochs(self)
        self._stream: Iterator[Any] | None = None
        self._pass_emitted = 0
        self._iterations = IteratorGeneration("ExactLengthLoader")
        self._epoch_yielded: int | None = None  # batches of the open epoch so far; None: no epoch open
        self._resume: dict | None = None  # set by load_state_dict()
        self._restored_at_end = False  # restored after an epoch's last batch: set_epoch may close it
        self._opening = False  # the current iteration opens an epoch, counted at its first batch

    @property
    def sifting_dataloader(self) -> SiftingDataloader | None:
        """The per-batch loader streamed (None around an epoch loader)."""
        return self.loader if isinstance(self.loader, SiftingDataloader) else None

    @property
    def epoch_sifting_dataloader(self) -> EpochSiftingDataloader | None:
        """The epoch loader streamed (None around a per-batch loader)."""
        return self.loader if isinstance(self.loader, EpochSiftingDataloader) else None

    def __len__(self) -> int:
        """Batches of an epoch; after ``load_state_dict()`` mid-epoch, what is left of that epoch."""
        if self._resume is not None and self._resume["epoch_yielded"] is not None:
            return max(0, self.steps_per_epoch - self._resume["epoch_yielded"])
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[Any]:
        number = self._iterations.start()
        resume, self._resume = self._resume, None
        if resume is None:
            self._restored_at_end = False
        if resume is not None and resume["in_pass"]:  # continue the interrupted pass: the loader resumes it
            self._stream = self._passes.start(self.passes - 1, resumed=True)
        start = 0 if resume is None or resume["epoch_yielded"] is None else resume["epoch_yielded"]
        # An epoch counts as started at its first batch: an iter() that is never advanced (Lightning
        # calls one to check the loader) starts none.
        self._opening = start == 0
        self._epoch_yielded = start
        self._passes.consumer_epoch_started()
        return self._epoch(number)

    def set_epoch(self, epoch: int) -> None:
        """The consumer starts its epoch ``epoch`` (0-based) next, as Lightning and the Hugging
        Face Trainer announce each epoch. Right after a state taken at an epoch's last batch
        was restored, announcing the next epoch closes the restored one (its rest is empty):
        the next iteration starts a new epoch. Announcing the restored epoch itself, or
        anything at any other time, changes nothing."""
        need_int(epoch, "set_epoch's epoch")
        if not self._restored_at_end:
            return
        self._restored_at_end = False
        if self.epochs_started is None or epoch != self.epochs_started:
            return  # the restored epoch itself (its empty rest), or a numbering of the consumer's own
        logger.info(
            "ExactLengthLoader: the consumer starts epoch %d; the restored epoch %d had ended", epoch, epoch - 1
        )
        if self._resume is not None:  # announced before iter(): the next iteration opens a new epoch
            self._resume["epoch_yielded"] = None
        else:  # announced after iter() (Lightning), before its first batch: that iteration is the new epoch
            self._epoch_yielded = 0
            self._opening = True

    def _epoch(self, number: int) -> Iterator[Any]:
        # None: the epoch was closed by a newer iteration or by load_state_dict(), which both
        # voided this iterator, so the check below refuses to go on.
        while self._epoch_yielded is None or self._epoch_yielded < self.steps_per_epoch:
            self._iterations.check(number)
            assert self._epoch_yielded is not None  # the current iteration opened the epoch
            if self._stream is None:
                self._stream = self._passes.start(self.passes, resumed=False)
                self.passes += 1
                self._pass_emitted = 0
            try:
                batch = next(self._stream)
            except StopIteration:
                self._stream = None
                if self._passes.cannot_fill(self._pass_emitted):
                    raise RuntimeError(
                        f"ExactLengthLoader: a whole pass over the source loader yielded no sample, so an epoch of "
                        f"{self.steps_per_epoch} batches cannot be filled (is the source loader empty?)"
                    ) from None
                continue
            self._pass_emitted += 1
            self._epoch_yielded += 1
            self._restored_at_end = False
            if self._opening:
                self._opening = False
                if self.epochs_started is not None:
                    self.epochs_started += 1
            if self._epoch_yielded == self.steps_per_epoch:
                self._passes.consumer_epoch_ended()  # losses from here on do not tell the look-ahead
            yield batch
        if self._iterations.is_current(number):
            self._passes.consumer_epoch_ended()
            self._epoch_yielded = None

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The loader's state plus this view's position: passes started, the consumer's epochs
        started, whether a pass is open, and how many batches of the open epoch were yielded."""
        return STATE_FORMAT.write(
            {
                "loader": self.loader.state_dict(),
                "steps_per_epoch": self.steps_per_epoch,
                "passes": self.passes,
                "in_pass": self._stream is not None,
                "pass_emitted": self._pass_emitted,
                "pass_seen_before": self._passes.seen_before,
                "epoch_yielded": self._epoch_yielded,
                "epochs_started": self.epochs_started,
            }
        )

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()`` (or a state of 0.4.0's ``EpochStream``); the next
        iteration continues where it was taken.

        Raises:
            ValueError: not a state of this class, a state saved at another world size
                (``load_state_dict_from_ranks`` resumes those), another ``steps_per_epoch``,
                or the sifting loader's own refusals.
        """
        state = read_state(state)
        check_world_size(state["loader"], self.loader.ranks.world_size)
        if state["steps_per_epoch"] != self.steps_per_epoch:
            raise ValueError(
                f"checkpoint has steps_per_epoch={state['steps_per_epoch']} but this loader has {self.steps_per_epoch}: "
                "resume with the dataset, batch size, sifting config and epochs the checkpoint was saved with"
            )
        self._passes.check_state(state["loader"], bool(state["in_pass"]))
        self.loader.load_state_dict(state["loader"])
        self._restore_position(state, int(state["pass_emitted"]))

    def load_state_dict_from_ranks(self, states: Sequence[dict]) -> None:
        """Restore from every rank's ``state_dict()`` of the run, at one step, saved at any
        world size: at this one, this rank's own state (the exact resume); at another, the
        epoch loader's ``load_state_dict_from_ranks`` of their loaders' states (the epoch in
        progress continues with its rest dealt out to the ranks now present), and this view
        keeps the position its consumer counted (the passes, the epochs started, the batches of
        the open epoch: Lightning and a loop count them too); epochs sized by ``epochs`` share
        this world size's rest of the plan equally over the consumer's epochs left. The
        per-batch loader does not resume at another world size.

        Raises:
            ValueError: not every rank's state of one run at one step, a per-batch loader's
                states of another world size, or the loaders' own refusals.
        """
        read = [read_state(s) for s in states]
        if not read:
            raise ValueError("load_state_dict_from_ranks needs the state of every rank of the run; got none")
        world, rank = self.loader.ranks.world_size, self.loader.ranks.rank
        same = len(read) == world
        if not isinstance(self.loader, EpochSiftingDataloader):
            if not same:
                raise ValueError(
                    f"the states were saved by {len(read)} rank(s), this run has {world}: ExactLengthLoader around a "
                    "SiftingDataloader resumes only at the world size it was saved at"
                )
            own = [s for s in read if saved_rank(s["loader"]) == rank]
            self.load_state_dict(own[0] if own else read[rank])  # no rank named: the loader refuses it
            return
        same_step(read, same)
        first = read[0]
        if same and first["steps_per_epoch"] != self.steps_per_epoch:
            raise ValueError(
                f"checkpoint has steps_per_epoch={first['steps_per_epoch']} but this loader has {self.steps_per_epoch}: "
                "resume with the dataset, batch size, sifting config and epochs the checkpoint was saved with"
            )
        self.loader.load_state_dict_from_ranks([s["loader"] for s in read])
        if not same and self._sized_by_epochs:
            self.steps_per_epoch = resized_steps(first, self.epochs, self.loader.planned_steps, self.steps_per_epoch)
        yielded = first["epoch_yielded"]
        if yielded is not None and yielded > self.steps_per_epoch:
            yielded = self.steps_per_epoch  # longer than this world size's epoch: it has ended
        self._restore_position({**first, "epoch_yielded": yielded}, int(first["pass_emitted"]))
        if not same:
            logger.info(
                "ExactLengthLoader: resumed %d rank(s)' states at %d, %d batches per epoch (saved: %d)",
                len(read),
                world,
                self.steps_per_epoch,
                int(first["steps_per_epoch"]),
            )

    def _restore_position(self, state: dict[str, Any], pass_emitted: int) -> None:
        self.passes = int(state["passes"])
        self._pass_emitted = pass_emitted
        self._passes.seen_before = int(state["pass_seen_before"])
        started = state["epochs_started"]
        self.epochs_started = None if started is None else int(started)
        self._stream = None
        self._epoch_yielded = None
        self._iterations.void_all()
        epoch_yielded = state["epoch_yielded"]
        self._resume = {
            "in_pass": bool(state["in_pass"]),
            "epoch_yielded": None if epoch_yielded is None else int(epoch_yielded),
        }
        self._restored_at_end = self._resume["epoch_yielded"] == self.steps_per_epoch

    # -- pass-through for trainers and metrics ---------------------------------------------

    @property
    def batch_size(self) -> int | None:
        return self.loader.batch_size

    @property
    def dataset(self) -> Any:
        """The source loader's dataset (a trainer counts examples with it)."""
        return getattr(underlying_dataloader(self.loader.orig_dataloader), "dataset", None)

    @property
    def counts(self) -> Any:
        return self.loader.counts

    @property
    def ranks(self) -> Any:
        """The sifting loader's data-parallel rank and world size (a checkpoint of the stream,
        ``PerRankLoaderState``'s for one, is kept per rank)."""
        return self.loader.ranks

    def metrics(self) -> dict:
        return self.loader.metrics()
