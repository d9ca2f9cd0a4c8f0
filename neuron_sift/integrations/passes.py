"""Either loader seen as a stream of passes: what the fixed-length stream and the step counts
ask of a mode.

Why one adapter per mode rather than a branch at every use: ``ExactLengthLoader``, the
length functions of ``schedules`` and the Trainer patches ask the same questions of both
loaders (how many batches a run plans, how a pass starts, whether a pass can ever yield),
and each mode answers them in one place. A pass of the per-batch loader is one epoch over
the source data; a pass of the epoch loader is one planned epoch.
"""

import math
from collections.abc import Iterator
from typing import Any

from neuron_sift.dataloader.loader_checkpoint import epoch_in_progress
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.shared.sources import underlying_dataloader

LOADERS = (SiftingDataloader, EpochSiftingDataloader)


def round_half_up(x: float) -> int:
    """``x`` rounded to the nearest int, halves up (Python's ``round`` rounds halves to even)."""
    return int(math.floor(x + 0.5))


def sifting_loader_of(obj: Any) -> SiftingDataloader | EpochSiftingDataloader:
    """The loader itself, or the one inside an ``ExactLengthLoader`` (either mode)."""
    if isinstance(obj, LOADERS):
        return obj
    inner = getattr(obj, "loader", None)
    if isinstance(inner, LOADERS):
        return inner
    raise TypeError(
        "expected a SiftingDataloader or an EpochSiftingDataloader (or an ExactLengthLoader around one), "
        f"got {type(obj).__name__}"
    )


def as_sifting_dataloader(obj: Any) -> SiftingDataloader:
    """The per-batch ``SiftingDataloader`` itself, or the one inside an ``ExactLengthLoader``."""
    loader = sifting_loader_of(obj) if not isinstance(obj, SiftingDataloader) else obj
    if not isinstance(loader, SiftingDataloader):
        raise TypeError(f"expected a SiftingDataloader (or an ExactLengthLoader around one), got {type(obj).__name__}")
    return loader


def set_source_epoch(source: Any, epoch: int) -> None:
    """Tell the source loader (or its sampler) which pass over the data starts."""
    if callable(getattr(source, "set_epoch", None)):
        source.set_epoch(epoch)
        return
    sampler: Any = getattr(underlying_dataloader(source), "sampler", None)
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)


class SiftingPasses:
    """Passes of a ``SiftingDataloader``: each is one epoch over the source data, started with
    ``set_epoch(pass index)`` on the source (or its sampler) so a shuffling sampler reshuffles.
    A pass that neither yields a batch nor reads a sample means the source is empty."""

    def __init__(self, loader: SiftingDataloader) -> None:
        self.loader = loader
        self.seen_before = 0  # samples seen when the open pass started

    def planned(self, epochs: int) -> int:
        return sum(self.loader.plan_epochs(epochs)[0])

    def default_steps(self, epochs: int) -> int:
        """The planned batches of ``epochs`` passes divided by ``epochs``, rounded half up;
        0 for an empty source."""
        planned = self.planned(epochs)
        if planned == 0 and len(underlying_dataloader(self.loader.orig_dataloader)) == 0:
            return 0
        return max(1, round_half_up(planned / epochs))

    def start(self, index: int, resumed: bool) -> Iterator[Any]:
        set_source_epoch(self.loader.orig_dataloader, index)
        if not resumed:
            self.seen_before = self.loader.counts.num_orig_samples_seen
        return iter(self.loader)

    def cannot_fill(self, emitted: int) -> bool:
        return emitted == 0 and self.loader.counts.num_orig_samples_seen == self.seen_before

    def check_state(self, loader_state: Any, in_pass: bool) -> None:
        if in_pass and not epoch_in_progress(loader_state):
            raise ValueError("inconsistent checkpoint: a pass is open but the sifting loader's epoch is not")

    def consumer_epoch_started(self) -> None:
        """Nothing to tell: the per-batch loader pairs no losses."""

    def consumer_epoch_ended(self) -> None:
        """Nothing to tell: the per-batch loader pairs no losses."""


class EpochPasses:
    """Passes of an ``EpochSiftingDataloader``: each is one planned epoch, iterated with
    ``iter_epoch(carry_pending=True)``, since a consumer (the Trainer's gradient accumulation)
    may still hold batches of the previous epoch. The plan is exact with a budget, so the
    default length rounds down and the stream never runs past the planned epochs. A restored
    epoch that was already used up yields nothing once; three empty passes in a row mean the
    loader yields nothing."""

    def __init__(self, loader: EpochSiftingDataloader) -> None:
        self.loader = loader
        self.seen_before = 0  # kept in the state's layout; the epoch loader counts its own progress
        self._empty_in_a_row = 0

    def planned(self, epochs: int | None) -> int:
        return self.loader.planned_steps(epochs)

    def default_steps(self, epochs: int) -> int:
        """The planned batches of ``epochs`` epochs divided by ``epochs``, rounded down
        (the last ``< epochs`` batches of the plan are left out)."""
        return max(1, self.planned(epochs) // epochs)

    def start(self, index: int, resumed: bool) -> Iterator[Any]:
        return self.loader.iter_epoch(carry_pending=True)

    def cannot_fill(self, emitted: int) -> bool:
        self._empty_in_a_row = self._empty_in_a_row + 1 if emitted == 0 else 0
        return self._empty_in_a_row > 2

    def check_state(self, loader_state: Any, in_pass: bool) -> None:
        """Nothing to check: the epoch loader's own state says whether an epoch is open."""

    def consumer_epoch_started(self) -> None:
        """A consumer's epoch began: its loop may pull deeper than at the last one's end."""
        self.loader.pairing.new_iteration()

    def consumer_epoch_ended(self) -> None:
        """A consumer's epoch gave its last batch: a loss arriving now does not tell the loop's
        look-ahead (a loop of accumulation steps wanted more batches than the epoch had left:
        the Trainer's short last step), as at the end of the loader's own iteration."""
        self.loader.pairing.iteration_ended()


def passes_of(loader: SiftingDataloader | EpochSiftingDataloader) -> SiftingPasses | EpochPasses:
    return SiftingPasses(loader) if isinstance(loader, SiftingDataloader) else EpochPasses(loader)
