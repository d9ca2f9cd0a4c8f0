"""The per-batch loader's host-side counts: one source for every number it reports.

Why apart from the loader: the counts are read by the metrics, the Trainer and Lightning
integrations and the checkpoint, and written by the loader's pass over its source; one object with
one ``state_dict`` keeps every reader on the same numbers. The count of non-finite losses
is not kept here: the engine's device counter sees every scored batch (also those whose
selection is never read back, fixed mode on XLA), so it is the only source, and
``SiftingCounts`` snapshots carry it in. Saving and refusing follow the package's
``shared.counts.CountSet``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from neuron_sift.shared.counts import CountSet


def _unbound() -> int:
    return 0


@dataclass
class SiftingCounts(CountSet):
    """Host-side accounting. Invariants: seen == kept + sifted; kept == emitted + pending + dropped.

    ``num_samples_dropped``: kept samples a data-parallel rank let go because its pending
    samples reached ``max_pending`` while its peers kept fewer (always 0 in one process and
    in fixed mode).

    Attributes:
        num_orig_samples_seen: source samples that reached the loader (delayed ones included).
        num_orig_samples_kept: samples kept (delayed ones included).
        num_orig_samples_sifted: samples left out.
        num_samples_emitted: samples handed to the training loop.
        num_samples_pending: kept samples pending until a full batch.
        num_batches_emitted: batches handed to the training loop.
        num_source_batches: source batches read.
        num_source_batches_delayed: source batches passed through during ``sift_delay``.
        num_nonfinite_losses: NaN or infinite losses seen (kept, never recorded in the history):
            read from the engine's counter on every access (a host read on a device), its one
            source; 0 for counts not bound to a loader. Saved in the state for its readers,
            restored with the engine's state (``IGNORED``).
        num_samples_dropped: kept samples dropped under the data-parallel bound on pending
            samples (``max_pending``).

    The loader's ``counts`` is this one object for the loader's lifetime: it stays current as
    the loader runs (a reference taken before an epoch reads that epoch's counts after it).
    """

    IGNORED = ("num_nonfinite_losses",)

    num_orig_samples_seen: int = 0
    num_orig_samples_kept: int = 0
    num_orig_samples_sifted: int = 0
    num_samples_emitted: int = 0
    num_samples_pending: int = 0
    num_batches_emitted: int = 0
    num_source_batches: int = 0
    num_source_batches_delayed: int = 0
    num_samples_dropped: int = 0
    # Where the non-finite count is read: the engine's counter (bound by the loader). Set
    # per instance (a plain default would be a class attribute, called as a method).
    _nonfinite: Callable[[], int] = field(default_factory=lambda: _unbound, init=False, repr=False, compare=False)

    @property
    def num_nonfinite_losses(self) -> int:
        return int(self._nonfinite())

    @property
    def observed_kept_share(self) -> float:
        """Kept / seen source samples so far (0.0 before any): the measured share, not the
        epoch mode's ``kept_share`` setting."""
        seen = self.num_orig_samples_seen
        return self.num_orig_samples_kept / seen if seen else 0.0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The counts' names, in the order of ``as_dict``: the host counts with the engine's
        non-finite count after the eighth, where smart_sifting's readers expect it."""
        host = cls.host_names()
        return (*host[:8], "num_nonfinite_losses", *host[8:])

    @classmethod
    def host_names(cls) -> tuple[str, ...]:
        """The counts kept here (every count but the engine's non-finite one)."""
        return super().names()

    def bind_nonfinite(self, source: Callable[[], int]) -> None:
        self._nonfinite = source

    def as_dict(self, nonfinite: int | None = None) -> dict[str, int]:
        """Every count by name, in the order of ``names``; ``nonfinite``: the non-finite count
        when the caller has just read it (saves a second host read)."""
        engine = self.num_nonfinite_losses if nonfinite is None else int(nonfinite)
        return {name: engine if name in self.IGNORED else int(getattr(self, name)) for name in self.names()}

    # -- what a pass over the source records -----------------------------------------------

    def delayed(self, n: int) -> None:
        """A source batch of ``n`` samples passed through unchanged during ``sift_delay``."""
        self.num_source_batches += 1
        self.num_source_batches_delayed += 1
        self.num_orig_samples_seen += n
        self.num_orig_samples_kept += n
        self.num_samples_emitted += n
        self.num_batches_emitted += 1

    def scored(self, n: int, kept: int, admitted: int) -> None:
        """A scored source batch of ``n`` samples: ``kept`` kept, of which ``admitted`` became
        pending (the rest dropped)."""
        self.num_orig_samples_seen += n
        self.num_orig_samples_kept += kept
        self.num_orig_samples_sifted += n - kept
        self.num_samples_pending += admitted
        self.num_samples_dropped += kept - admitted

    def emitted(self, n: int) -> None:
        """A full batch of ``n`` kept samples handed to the training loop."""
        self.num_samples_emitted += n
        self.num_samples_pending -= n
        self.num_batches_emitted += 1
