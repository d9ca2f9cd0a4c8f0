"""The loader's host-side counts and phase timings: one source for every number it reports.

Why apart from the loader: the counts are read by the metrics, the Trainer and Lightning
integrations and the checkpoint, and written by the per-epoch iterator; one object with
one ``state_dict`` keeps every reader on the same numbers. The count of non-finite losses
is not kept here: the engine's device counter sees every scored batch (also those whose
selection is never read back, fixed mode on XLA), so it is the only source, and
``SiftingCounts`` snapshots carry it in.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TypeVar

T = TypeVar("T")


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
        num_nonfinite_losses: NaN or infinite losses seen (kept, never recorded in the history):
            read from the engine's counter on every access (a host read on a device), its one
            source; 0 for counts not bound to a loader.
        num_samples_dropped: kept samples dropped under the data-parallel backlog bound.

    The loader's ``counts`` is this one object for the loader's lifetime: it stays current as
    the loader runs (a reference taken before an epoch reads that epoch's counts after it).
    """

    num_orig_samples_seen: int = 0
    num_orig_samples_kept: int = 0
    num_orig_samples_sifted: int = 0
    num_samples_emitted: int = 0
    num_samples_pending: int = 0
    num_batches_emitted: int = 0
    num_source_batches: int = 0
    num_source_batches_delayed: int = 0
    num_samples_dropped: int = 0
    # Where the non-finite count is read: the engine's counter (bound by the loader).
    _nonfinite: Callable[[], int] = field(default=lambda: 0, init=False, repr=False, compare=False)

    @property
    def num_nonfinite_losses(self) -> int:
        return int(self._nonfinite())

    @staticmethod
    def names() -> tuple[str, ...]:
        """The counts' names, in the order of ``as_dict``."""
        return (*_HOST_COUNTS[:8], "num_nonfinite_losses", *_HOST_COUNTS[8:])

    def bind_nonfinite(self, source: Callable[[], int]) -> None:
        self._nonfinite = source

    def as_dict(self, nonfinite: int | None = None) -> dict:
        """Every count by name, in the documented order; ``nonfinite``: the non-finite count
        when the caller has just read it (saves a second host read)."""
        out = {name: getattr(self, name) for name in _HOST_COUNTS[:8]}
        out["num_nonfinite_losses"] = self.num_nonfinite_losses if nonfinite is None else int(nonfinite)
        out["num_samples_dropped"] = self.num_samples_dropped
        return out

    # -- what the per-epoch iterator records ------------------------------------------------

    def delayed(self, n: int) -> None:
        """A source batch of ``n`` samples passed through unchanged during ``sift_delay``."""
        self.num_source_batches += 1
        self.num_source_batches_delayed += 1
        self.num_orig_samples_seen += n
        self.num_orig_samples_kept += n
        self.num_samples_emitted += n
        self.num_batches_emitted += 1

    def scored(self, n: int, kept: int, held: int) -> None:
        """A scored source batch of ``n`` samples: ``kept`` kept, of which ``held`` wait (the rest dropped)."""
        self.num_orig_samples_seen += n
        self.num_orig_samples_kept += kept
        self.num_orig_samples_sifted += n - kept
        self.num_samples_pending += held
        self.num_samples_dropped += kept - held

    def emitted(self, n: int) -> None:
        """A full batch of ``n`` kept samples handed to the training loop."""
        self.num_samples_emitted += n
        self.num_samples_pending -= n
        self.num_batches_emitted += 1

    # -- checkpoints -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return self.as_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore the host counts; ``num_nonfinite_losses`` is ignored (the engine's state holds it)."""
        unknown = sorted(set(state) - set(_HOST_COUNTS) - {"num_nonfinite_losses"})
        if unknown:
            raise ValueError(f"unknown count(s) in the checkpoint: {unknown}")
        for name in _HOST_COUNTS:
            setattr(self, name, int(state.get(name, 0)))


# The counts kept on the host, in the documented order (num_nonfinite_losses goes after the eighth).
_HOST_COUNTS = tuple(f.name for f in fields(SiftingCounts) if not f.name.startswith("_"))
