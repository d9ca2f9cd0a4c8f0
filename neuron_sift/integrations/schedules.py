"""Lengths for learning-rate schedules and for trainers that plan from ``len()``.

``SiftingDataloader.__len__`` covers the next epoch: exact in ``fixed`` mode, the
expected count in ``probabilistic`` mode. A schedule spans many epochs, and the epochs of
a sifted loader differ in length (the ``sift_delay`` batches pass through unsifted in the
first epoch only, and kept samples not yet emitted carry over into the next epoch), so
``len(loader) * epochs`` is not the number of steps a run takes. Here:

- ``epoch_plan(loader, epochs)``: the batches each of the next ``epochs`` epochs emits;
  exact in ``fixed`` mode, expected in ``probabilistic`` mode. ``epoch_plan(loader, 1)[0]
  == len(loader)``.
- ``planned_steps(loader, epochs, sigmas=0.0)``: their sum, optionally plus ``sigmas``
  standard deviations of the probabilistic count (a planning bound).
- ``ExactLengthLoader(loader, epochs=E)``: a view of the sifted stream in which every epoch
  is exactly ``len()`` batches long, in either mode, so a schedule or a trainer sized from
  ``len()`` ends exactly at its planned end. Epochs are then equal shares of the sifted
  stream rather than passes over the source data (see the class).
"""

import math
from collections.abc import Iterator
from typing import Any

from neuron_sift.dataloader.checkpoint import epoch_in_progress
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.shared.checkpoints import StateFormat
from neuron_sift.shared.sources import underlying_dataloader


def as_sifting_dataloader(loader: Any) -> SiftingDataloader:
    """The ``SiftingDataloader`` itself, or the one inside an ``ExactLengthLoader``."""
    if isinstance(loader, SiftingDataloader):
        return loader
    inner = getattr(loader, "sifting_dataloader", None)
    if isinstance(inner, SiftingDataloader):
        return inner
    raise TypeError(f"expected a SiftingDataloader (or an ExactLengthLoader around one), got {type(loader).__name__}")


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def _plan(loader: Any, epochs: int):
    """Per-epoch batch counts and the number of scored source samples (the loader's plan)."""
    return as_sifting_dataloader(loader).plan_epochs(epochs)


def epoch_plan(loader: Any, epochs: int = 1) -> list[int]:
    """Batches emitted by each of the next ``epochs`` epochs of ``loader``.

    Exact in ``fixed`` mode; in ``probabilistic`` mode the expected counts (kept share
    ``1 / (1 + beta)`` of every sifted sample). Accounts for ``sift_delay`` (and
    ``repeat_delay_per_epoch``) and for kept samples carried from one epoch to the next.
    Raises ``TypeError`` when the source loader has no length.
    """
    return _plan(loader, epochs)[0]


def planned_steps_std(loader: Any, epochs: int = 1) -> float:
    """Standard deviation, in batches, of the emitted count over the next ``epochs`` epochs.

    0 in ``fixed`` mode. In ``probabilistic`` mode each sifted sample is kept with marginal
    probability ``s = 1 / (1 + beta)`` when its loss percentile is uniform over the history
    (losses exchangeable within the history window), so n sifted samples keep
    ``n * s +- sqrt(n * s * (1 - s))``. While the loss falls fast relative to the history
    window, new losses rank low and fewer samples than that are kept.
    """
    sl = as_sifting_dataloader(loader)
    if sl.selection_mode == "fixed":
        return 0.0
    return _std_of_count(sl, _plan(loader, epochs)[1])


def _std_of_count(sl: Any, sifted: int) -> float:
    """Binomial spread, in batches, of the kept count of ``sifted`` samples (probabilistic mode)."""
    if sl.selection_mode == "fixed":
        return 0.0
    s = 1.0 / (1.0 + sl.sift_config.beta_value)
    return math.sqrt(sifted * s * (1.0 - s)) / sl.batch_size


def planned_steps(loader: Any, epochs: int = 1, *, sigmas: float = 0.0) -> int:
    """Training steps (emitted batches) of the next ``epochs`` epochs of ``loader``.

    ``fixed`` mode: exact. ``probabilistic`` mode: the expected count plus ``sigmas``
    standard deviations (``planned_steps_std``), rounded up; ``sigmas=4`` gives a count the
    run exceeds only rarely (e.g. ``OneCycleLR(total_steps=...)``, which raises when
    stepped past its end), a negative ``sigmas`` a count it rarely falls short of.
    """
    plan, sifted = _plan(loader, epochs)  # planned once: a Python loop over every source batch
    total = sum(plan)
    if sigmas:
        total += math.ceil(sigmas * _std_of_count(as_sifting_dataloader(loader), sifted))
    return max(total, 0)


def _set_source_epoch(source: Any, epoch: int) -> None:
    """Tell the source loader (or its sampler) which pass over the data starts."""
    if callable(getattr(source, "set_epoch", None)):
        source.set_epoch(epoch)
        return
    sampler: Any = getattr(underlying_dataloader(source), "sampler", None)
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)


STATE_FORMAT = StateFormat(
    "ExactLengthLoader",
    1,
    ("loader", "steps_per_epoch", "passes", "in_pass", "pass_emitted", "pass_seen_before", "epoch_yielded"),
    legacy=lambda state: "steps_per_epoch" in state and "loader" in state,
    unversioned=1,  # 0.4.0 and before saved neither kind nor version
)


class ExactLengthLoader:
    """Every epoch yields exactly ``len(self)`` sifted batches, in either selection mode.

    Wraps a ``SiftingDataloader`` and reads its batches as one continuous stream: an epoch
    takes the next ``steps_per_epoch`` batches, continuing the current pass over the source
    data or starting a new one when the current pass is used up. Nothing is dropped or
    repeated, and no pass is cut short: an epoch that ends mid-pass leaves the rest of the
    pass to the next epoch. ``steps_per_epoch`` defaults to the planned steps of ``epochs``
    passes divided by ``epochs`` (rounded), so ``epochs`` epochs of this loader take
    ``epochs * len()`` batches, within ``epochs / 2`` of the planned batches of ``epochs``
    passes, and a schedule built from ``len(loader) * epochs`` ends exactly at its planned
    end. An epoch abandoned by its consumer is continued by the next one. Each new pass calls
    ``set_epoch(pass_index)`` on the source loader (or its sampler) when it has one, so
    a shuffling sampler reshuffles per pass.

    An empty source loader gives ``len() == 0`` (and epochs that yield nothing); with an
    explicit ``steps_per_epoch`` an epoch over an empty source raises ``RuntimeError``
    instead of yielding fewer batches than ``len()``.

    ``state_dict()`` / ``load_state_dict()`` hold the sifting loader's state, the passes
    started, and where the current epoch and pass stand; resumed with the same source order
    (the same ``set_epoch`` calls happen again), it yields exactly the batches of the
    uninterrupted run. As with ``SiftingDataloader``, resume the epoch you were in: its
    first iteration yields the rest of that epoch (``len()`` says how many).
    """

    length_is_exact = True

    def __init__(self, loader: Any, steps_per_epoch: int | None = None, *, epochs: int = 1):
        self.sifting_dataloader = as_sifting_dataloader(loader)
        if steps_per_epoch is None:
            planned = planned_steps(self.sifting_dataloader, epochs)
            empty = planned == 0 and len(underlying_dataloader(self.sifting_dataloader.orig_dataloader)) == 0
            steps_per_epoch = 0 if empty else max(1, _round_half_up(planned / epochs))
        elif isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be an int >= 1, got {steps_per_epoch!r}")
        self.steps_per_epoch = steps_per_epoch
        self.passes = 0  # passes over the source data started so far
        self._stream: Iterator[Any] | None = None
        self._pass_seen_before = 0
        self._pass_emitted = 0
        self._token = 0
        self._epoch_yielded: int | None = None  # batches of the open epoch so far; None: no epoch open
        self._resume: dict | None = None  # set by load_state_dict()

    def __len__(self) -> int:
        """Batches of an epoch; after ``load_state_dict()`` mid-epoch, what is left of that epoch."""
        if self._resume is not None and self._resume["epoch_yielded"] is not None:
            return max(0, self.steps_per_epoch - self._resume["epoch_yielded"])
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[Any]:
        self._token += 1
        start = 0
        resume, self._resume = self._resume, None
        if resume is not None:
            start = resume["epoch_yielded"] or 0
            if resume["in_pass"]:  # continue the interrupted pass: the sifting loader resumes it
                _set_source_epoch(self.sifting_dataloader.orig_dataloader, self.passes - 1)
                self._stream = iter(self.sifting_dataloader)
        self._epoch_yielded = start
        return self._epoch(self._token)

    def _epoch(self, token: int) -> Iterator[Any]:
        # None: the epoch was closed by a newer iteration or by load_state_dict(), which both
        # changed the token, so the check below refuses to go on.
        while self._epoch_yielded is None or self._epoch_yielded < self.steps_per_epoch:
            if token != self._token:
                raise RuntimeError("ExactLengthLoader: a new iteration was started; this iterator is no longer valid")
            assert self._epoch_yielded is not None  # with the current token, __iter__ opened the epoch
            if self._stream is None:
                _set_source_epoch(self.sifting_dataloader.orig_dataloader, self.passes)
                self.passes += 1
                self._stream = iter(self.sifting_dataloader)
                self._pass_seen_before = self.sifting_dataloader.counts.num_orig_samples_seen
                self._pass_emitted = 0
            try:
                batch = next(self._stream)
            except StopIteration:
                self._stream = None
                seen = self.sifting_dataloader.counts.num_orig_samples_seen
                if self._pass_emitted == 0 and seen == self._pass_seen_before:
                    raise RuntimeError(
                        f"ExactLengthLoader: a whole pass over the source loader yielded no sample, so an epoch of "
                        f"{self.steps_per_epoch} batches cannot be filled (is the source loader empty?)"
                    ) from None
                continue
            self._pass_emitted += 1
            self._epoch_yielded += 1
            yield batch
        if token == self._token:
            self._epoch_yielded = None

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The sifting loader's state plus this view's position: passes started, whether a
        pass is open, and how many batches of the open epoch were yielded."""
        return STATE_FORMAT.write(
            {
                "loader": self.sifting_dataloader.state_dict(),
                "steps_per_epoch": self.steps_per_epoch,
                "passes": self.passes,
                "in_pass": self._stream is not None,
                "pass_emitted": self._pass_emitted,
                "pass_seen_before": self._pass_seen_before,
                "epoch_yielded": self._epoch_yielded,
            }
        )

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()``; the next iteration continues where it was taken."""
        state = STATE_FORMAT.read(state)
        if state["steps_per_epoch"] != self.steps_per_epoch:
            raise ValueError(
                f"checkpoint has steps_per_epoch={state['steps_per_epoch']} but this loader has {self.steps_per_epoch}"
            )
        if state["in_pass"] and not epoch_in_progress(state["loader"]):
            raise ValueError("inconsistent checkpoint: a pass is open but the sifting loader's epoch is not")
        self.sifting_dataloader.load_state_dict(state["loader"])
        self.passes = int(state["passes"])
        self._pass_emitted = int(state["pass_emitted"])
        self._pass_seen_before = int(state["pass_seen_before"])
        self._stream = None
        self._epoch_yielded = None
        self._token += 1
        epoch_yielded = state["epoch_yielded"]
        self._resume = {
            "in_pass": bool(state["in_pass"]),
            "epoch_yielded": None if epoch_yielded is None else int(epoch_yielded),
        }

    # -- pass-through for trainers and metrics ---------------------------------------------

    @property
    def batch_size(self) -> int | None:
        return self.sifting_dataloader.batch_size

    @property
    def dataset(self) -> Any:
        """The source loader's dataset (a trainer counts examples with it)."""
        return getattr(underlying_dataloader(self.sifting_dataloader.orig_dataloader), "dataset", None)

    @property
    def counts(self):
        return self.sifting_dataloader.counts

    def metrics(self) -> dict:
        return self.sifting_dataloader.metrics()
