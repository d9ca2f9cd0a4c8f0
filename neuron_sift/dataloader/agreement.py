"""How many full batches a rank may emit, and how many kept samples it may keep pending.

Why a part of its own: in probabilistic mode each rank keeps a different number of samples,
so under ``torch.distributed`` the ranks must agree on how many batches to emit or the rank
with more batches waits forever in DDP's gradient all-reduce. They agree every
``sync_every`` scored source batches (about once per emitted batch) and at the end of each
epoch, with one all-reduce(MIN) of one int64; a rank that keeps more than its peers keeps
at most ``max_pending`` samples pending and drops its newest kept samples past that
(counted, logged). One process, and fixed mode (every rank keeps the same count by construction),
emit whatever is ready and never drop.
"""

from typing import Any

from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.state_checks import need_int, need_mapping


class EmissionAgreement:
    """The emission budget of one rank; its ``state_dict`` holds the agreement in progress."""

    def __init__(self, ranks: RankGroup, coordinated: bool, beta_value: float, max_pending: int | None):
        if max_pending is not None and (isinstance(max_pending, bool) or not isinstance(max_pending, int)):
            raise TypeError(f"max_pending must be an int, got {type(max_pending).__name__}")
        self.ranks = ranks
        self.coordinated = coordinated
        self.max_pending_arg = max_pending
        self.sync_every = max(1, int(1.0 + beta_value))
        self.since_sync = 0
        self.budget_left = 0  # batches agreed at the last agreement point and not yet emitted

    def max_pending(self, batch_size: int | None) -> int | None:
        """The bound on pending samples for ``batch_size`` (None while it is unknown)."""
        if self.max_pending_arg is not None:
            if batch_size is not None and self.max_pending_arg < batch_size:
                raise ValueError(f"max_pending={self.max_pending_arg} is below the batch size {batch_size}")
            return self.max_pending_arg
        return None if batch_size is None else 4 * batch_size

    def admitted(self, n_kept: int, pending: int, batch_size: int) -> int:
        """How many of ``n_kept`` newly kept samples may join the ``pending`` ones (the first
        ones, in source order; the rest are dropped)."""
        if not self.coordinated:
            return n_kept
        bound = self.max_pending(batch_size)
        assert bound is not None  # the batch size is known once a batch was scored
        return max(0, min(n_kept, bound - pending))

    def open_budget(self, ready: int, end_of_epoch: bool) -> int | None:
        """Batches to emit now, of ``ready`` full ones pending; None: every ready one.

        Coordinated ranks emit only at agreement points (the minimum over ranks of their
        ready batches), else 0; the agreed count is kept in ``budget_left`` until every
        agreed batch is out, so a checkpoint taken between two of them resumes with the rest.
        """
        if not self.coordinated:
            return None
        if not end_of_epoch:
            self.since_sync += 1
            if self.since_sync < self.sync_every:
                self.budget_left = 0
                return 0
        self.since_sync = 0
        self.budget_left = self.ranks.min_int(ready)
        return self.budget_left

    def resumed_budget(self) -> int | None:
        """The agreed batches a checkpoint had not emitted yet (None when uncoordinated)."""
        return self.budget_left if self.coordinated else None

    def spent(self) -> None:
        """One agreed batch was emitted."""
        self.budget_left -= 1

    def state_dict(self) -> dict:
        return {"since_sync": self.since_sync, "budget_left": self.budget_left}

    def check_state(self, state: Any) -> None:
        """Refuse counts that are not ints >= 0 (a state without them, of 0.2.0, agreed on none)."""
        for key, value in need_mapping(state, "agreement").items():
            if key in ("since_sync", "budget_left"):
                need_int(value, f"agreement.{key}", 0)

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.since_sync = int(state.get("since_sync", 0))
        self.budget_left = int(state.get("budget_left", 0))
