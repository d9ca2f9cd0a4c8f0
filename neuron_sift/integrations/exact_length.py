"""``ExactLengthLoader``: epochs of exactly ``len()`` batches over either loader's stream of passes.

Why: a trainer or a schedule sized from ``len()`` needs every epoch to be that long, and a
sifted pass is not (probabilistic counts, the delay and carried samples in the per-batch
mode; plans that change from epoch to epoch in the epoch mode). Reading the passes as one
continuous stream cut into equal epochs makes the length exact without dropping or
repeating a batch. One class for both modes, so there is one state and one lifetime rule.

Import it from ``neuron_sift.integrations.schedules`` (its documented path).
"""

from collections.abc import Iterator
from typing import Any

from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.integrations.passes import passes_of, sifting_loader_of
from neuron_sift.shared.checkpoints import StateFormat, state_kind
from neuron_sift.shared.iterators import IteratorGeneration
from neuron_sift.shared.sources import underlying_dataloader
from neuron_sift.shared.validation import positive_int

STATE_FORMAT = StateFormat(
    "ExactLengthLoader",
    1,
    ("loader", "steps_per_epoch", "passes", "in_pass", "pass_emitted", "pass_seen_before", "epoch_yielded"),
    legacy=lambda state: "steps_per_epoch" in state and "loader" in state,
    unversioned=1,  # 0.4.0 and before saved neither kind nor version
)

# 0.4.0's ``EpochStream`` (the epoch Trainer integration's stream, now this class) saved
# the epoch loader's state, its epoch length and how far the open epoch had come.
EPOCH_STREAM_FORMAT = StateFormat(
    "EpochStream",
    1,
    ("loader", "per_epoch", "in_epoch"),
    legacy=lambda state: "per_epoch" in state and "in_epoch" in state,
    unversioned=1,
)


def closed_epoch(state: Any) -> dict[str, Any]:
    """An ``ExactLengthLoader`` state (any layout ``read_state`` reads) with its open epoch
    closed, as the uninterrupted run's next ``iter()`` closes an epoch that yielded its last
    batch: the pass in progress continues, the epoch's count starts again. For trainers that
    start a new epoch after a checkpoint taken at an epoch's end (the Hugging Face Trainer,
    Lightning), where the stream would otherwise continue the saved epoch's empty rest. The
    state is verified and written (and sealed) anew, never edited by hand."""
    read = read_state(state)
    return STATE_FORMAT.write({**{p: read[p] for p in STATE_FORMAT.parts}, "epoch_yielded": None})


def read_state(state: Any) -> dict[str, Any]:
    """An ``ExactLengthLoader`` state in the current layout; a state of 0.4.0's ``EpochStream``
    is converted (the open epoch's position is kept; the count of passes, which the epoch
    mode does not use, starts at 0)."""
    if state_kind(state) != "EpochStream":
        return STATE_FORMAT.read(state)
    old = EPOCH_STREAM_FORMAT.read(state)
    in_epoch = int(old["in_epoch"])
    return {
        "kind": STATE_FORMAT.kind,
        "version": STATE_FORMAT.version,
        "loader": old["loader"],
        "steps_per_epoch": int(old["per_epoch"]),
        "passes": 0,
        "in_pass": False,  # the epoch loader's own state continues its open epoch
        "pass_emitted": 0,
        "pass_seen_before": 0,
        "epoch_yielded": in_epoch if in_epoch else None,
    }


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
    loader (its plan is exact: the stream never runs past the planned epochs). Each new pass
    of the per-batch loader calls ``set_epoch(pass_index)`` on the source loader (or its
    sampler) when it has one, so a shuffling sampler reshuffles per pass; the epoch loader
    is iterated with ``iter_epoch(carry_pending=True)`` (a consumer may still hold batches
    of the previous epoch).

    An empty source loader gives ``len() == 0`` (and epochs that yield nothing); with an
    explicit ``steps_per_epoch`` an epoch over an empty source raises ``RuntimeError``
    instead of yielding fewer batches than ``len()``.

    ``state_dict()`` / ``load_state_dict()`` hold the loader's state, the passes started,
    and where the current epoch and pass stand (a state of 0.4.0's ``EpochStream`` also
    loads); resumed with the same source order, it yields exactly the batches of the
    uninterrupted run. As with the loaders, resume the epoch you were in: its first
    iteration yields the rest of that epoch (``len()`` says how many). A newer ``iter()``
    (or ``load_state_dict()``) voids the iterators handed out before it.
    """

    length_is_exact = True

    def __init__(self, loader: Any, steps_per_epoch: int | None = None, *, epochs: int = 1):
        self.loader = sifting_loader_of(loader)
        self._passes = passes_of(self.loader)
        if steps_per_epoch is None:
            steps_per_epoch = self._passes.default_steps(epochs)  # 0 for an empty source
        else:
            positive_int(steps_per_epoch, "steps_per_epoch")
        self.steps_per_epoch = steps_per_epoch
        self.passes = 0  # passes started so far
        self._stream: Iterator[Any] | None = None
        self._pass_emitted = 0
        self._iterations = IteratorGeneration("ExactLengthLoader")
        self._epoch_yielded: int | None = None  # batches of the open epoch so far; None: no epoch open
        self._resume: dict | None = None  # set by load_state_dict()

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
        start = 0
        resume, self._resume = self._resume, None
        if resume is not None:
            start = resume["epoch_yielded"] or 0
            if resume["in_pass"]:  # continue the interrupted pass: the loader resumes it
                self._stream = self._passes.start(self.passes - 1, resumed=True)
        self._epoch_yielded = start
        return self._epoch(number)

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
            yield batch
        if self._iterations.is_current(number):
            self._epoch_yielded = None

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The loader's state plus this view's position: passes started, whether a pass is
        open, and how many batches of the open epoch were yielded."""
        return STATE_FORMAT.write(
            {
                "loader": self.loader.state_dict(),
                "steps_per_epoch": self.steps_per_epoch,
                "passes": self.passes,
                "in_pass": self._stream is not None,
                "pass_emitted": self._pass_emitted,
                "pass_seen_before": self._passes.seen_before,
                "epoch_yielded": self._epoch_yielded,
            }
        )

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()`` (or a state of 0.4.0's ``EpochStream``); the next
        iteration continues where it was taken."""
        state = read_state(state)
        if state["steps_per_epoch"] != self.steps_per_epoch:
            raise ValueError(
                f"checkpoint has steps_per_epoch={state['steps_per_epoch']} but this loader has {self.steps_per_epoch}"
            )
        self._passes.check_state(state["loader"], bool(state["in_pass"]))
        self.loader.load_state_dict(state["loader"])
        self.passes = int(state["passes"])
        self._pass_emitted = int(state["pass_emitted"])
        self._passes.seen_before = int(state["pass_seen_before"])
        self._stream = None
        self._epoch_yielded = None
        self._iterations.void_all()
        epoch_yielded = state["epoch_yielded"]
        self._resume = {
            "in_pass": bool(state["in_pass"]),
            "epoch_yielded": None if epoch_yielded is None else int(epoch_yielded),
        }

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
