"""The loader's parts as its pass over the source and its checkpoint see them.

Why a Protocol: the loader makes its iterator and composes its checkpoint, so both are
below it; naming here what they read of the loader (instead of importing the loader
class) keeps every arrow of the per-batch wing pointing down.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.backends.pending import PendingStore
from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.saved_batch import SavedBatch
from neuron_sift.dataloader.agreement import EmissionAgreement
from neuron_sift.dataloader.batch_scorer import BatchScorer
from neuron_sift.dataloader.delay import SiftDelay
from neuron_sift.dataloader.notices import RateLimitedNotice
from neuron_sift.dataloader.payback import PaybackCheck
from neuron_sift.dataloader.sample_ids import SampleIds
from neuron_sift.dataloader.sifting_counts import SiftingCounts
from neuron_sift.engine.sifter import Sifter
from neuron_sift.shared.counts import PhaseTimings
from neuron_sift.shared.iterators import IteratorGeneration
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.state_checks import invalid, need_bool, need_int, need_mapping
from neuron_sift.sift_config.sift_configs import RelativeProbabilisticSiftConfig


@dataclass
class PassPosition:
    """Where the loader stands in its pass over the source: the epochs started (``epoch``,
    what ``loader.epoch`` reports, as the epoch loader's does), whether the last one is under
    way, and the source batches of it fully counted (``consumed``)."""

    epoch: int = 0
    in_progress: bool = False
    consumed: int = 0

    @property
    def index(self) -> int:
        """The 0-based index of the current (or last) epoch: how the logs, the epoch mode and
        samplers' ``set_epoch`` number epochs (-1 before the first)."""
        return self.epoch - 1

    def state_dict(self) -> dict:
        return asdict(self)

    def check_state(self, state: Any) -> None:
        """Refuse a state that is not epochs started, whether the last is under way and the
        source batches of it consumed (an epoch under way is one started)."""
        need_mapping(state, "epoch", ("epoch", "in_progress", "consumed"))
        started = need_int(state["epoch"], "epoch.epoch", 0)
        if need_bool(state["in_progress"], "epoch.in_progress") and started == 0:
            invalid("epoch.in_progress", "is True but no epoch was started (epoch.epoch is 0)")
        need_int(state["consumed"], "epoch.consumed", 0)

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.epoch, self.in_progress, self.consumed = (
            int(state["epoch"]),
            bool(state["in_progress"]),
            int(state["consumed"]),
        )

    @classmethod
    def from_state(cls, state: dict) -> "PassPosition":
        position = cls()
        position.load_state_dict(state)
        return position


class SiftingParts(Protocol):
    """What ``SiftingPass`` and ``loader_checkpoint.py`` use of a ``SiftingDataloader``."""

    # the user's arguments
    orig_dataloader: Any
    source: Any  # what the passes read: orig_dataloader, or it rebuilt to record sample ids
    model: torch.nn.Module
    loss_fn: Callable[..., Any]
    batch_transforms: Any
    sift_config: RelativeProbabilisticSiftConfig
    log_batch_data: bool
    log_batch_contents: bool
    # the parts, each with one job
    backend: Backend
    ranks: RankGroup
    sifter: Sifter
    counts: SiftingCounts
    delay: SiftDelay
    agreement: EmissionAgreement
    pending: PendingStore | None
    position: PassPosition
    iterations: IteratorGeneration
    phases: PhaseTimings
    nonfinite_notice: RateLimitedNotice
    drop_notice: RateLimitedNotice
    scorer: BatchScorer
    sample_ids: SampleIds | None
    payback: PaybackCheck

    @property
    def batch_size(self) -> int | None: ...

    @property
    def selection_mode(self) -> str: ...

    def pending_store_for(self, batch: SiftingBatch) -> PendingStore: ...

    def restore_pending(self, batch_size: int | None, pending: PendingStore | None) -> None: ...


def new_pending_store(sl: SiftingParts, default_batch: bool, batch_size: int | None = None) -> PendingStore:
    """The backend's pending store for the loader ``sl``, once its batch size is known (or
    ``batch_size``, a checkpoint's): added to in rows of fixed mode's keep count (else of a
    batch), bounded by ``max_pending`` when the ranks agree on emission; ``default_batch``:
    for batches of the default handling."""
    b = sl.batch_size if batch_size is None else batch_size
    assert b is not None  # learned from the first scored batch, or restored with the checkpoint
    rows = sl.sifter.fixed_keep_count(b) if sl.sift_config.keeps_exact_count else b
    limit = sl.agreement.max_pending(b) if sl.agreement.coordinated else None
    return sl.backend.pending_store(b, rows, limit, default_batch)


def restored_pending_store(sl: SiftingParts, saved: dict, batch_size: int | None = None) -> PendingStore:
    """A pending store for ``sl`` holding a checkpoint's ``saved`` pending samples (of a
    checkpoint's ``batch_size``), made without changing ``sl``: a checkpoint is read into it
    before any part of the loader loads, so samples that cannot be restored change nothing."""
    try:
        restored = SavedBatch(saved)
        store = new_pending_store(sl, restored.is_default, batch_size)
        store.restore(restored)
    except (TypeError, KeyError, IndexError, AttributeError, RuntimeError, ValueError) as e:
        raise ValueError(f"invalid SiftingDataloader state: pending: its samples cannot be restored ({e})") from e
    return store
