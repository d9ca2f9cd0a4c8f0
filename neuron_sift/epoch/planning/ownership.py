"""Which rank owns which sample under a sharded score table, and where its score lives.

Why positions modulo the world size: rank ``r`` of ``W`` owns the samples at positions
``r, r + W, r + 2W, ...`` of the samples the user's sampler yields (the support; all of
``0 .. N-1`` without one). Each rank then owns ``M // W`` or one more sample, whatever the
order of the dataset (contiguous ranges would give a rank a whole class of a dataset
sorted by label), its samples' slots are ``position // W`` (no index array: ``O(1)``
memory for the whole-dataset case), and any rank computes the owner of any sample from
its id alone.

A rank's score table, weights and noise-guard streaks are indexed by *slot*; plans and
batches speak dataset ids. ``slots`` is the one translation, and it refuses an id this
rank does not own, so a loss can never land in another sample's slot.

Guests: an epoch resumed at another world size (``resuming/sharded_reshard.py``) deals its rest out to the
new ranks whatever their ownership, so a rank may train samples another rank owns. It
hosts them for that epoch in slots after its own (``adopt``); their scores go to their
owners when the epoch ends (``OwnedShares.open_scores``).
"""

import numpy as np


class Ownership:
    """Rank ``rank`` of ``world_size``'s share of the ``n`` samples (``support``: the sorted
    dataset ids the sampler yields; None: all)."""

    def __init__(self, n: int, support: np.ndarray | None, world_size: int, rank: int) -> None:
        self.n = n
        self.support = support
        self.m = n if support is None else int(support.shape[0])
        self.world_size = world_size
        self.rank = rank
        self.owned = len(range(rank, self.m, world_size))  # this rank's slots
        self.guests = np.empty(0, dtype=np.int64)  # sorted ids hosted after them (see the module's docstring)

    @property
    def size(self) -> int:
        """Slots in all: owned, then guests."""
        return self.owned + int(self.guests.shape[0])

    def adopt(self, guests: np.ndarray) -> None:
        """Host ``guests`` (ids another rank owns) in the slots after this rank's own, replacing any before."""
        guests = np.unique(np.asarray(guests, dtype=np.int64))
        if guests.size and (self.owners(guests) == self.rank).any():
            raise AssertionError("internal error: a rank cannot host a sample it owns")
        self.guests = guests

    def ids(self) -> np.ndarray:
        """The dataset ids of this rank's slots, in slot order (int64)."""
        positions = np.arange(self.rank, self.m, self.world_size, dtype=np.int64)
        return positions if self.support is None else self.support[positions]

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """The positions of ``ids`` among the sampler's samples (ValueError for one it never yields)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.support is None:
            bad = (ids < 0) | (ids >= self.n)
            pos = ids
        else:
            pos = np.minimum(np.searchsorted(self.support, ids), max(self.m - 1, 0))
            bad = self.support[pos] != ids if self.m else np.ones(ids.shape, dtype=bool)
        if bad.any():
            raise ValueError(f"sample id {int(ids[bad][0])} is not one the sampler yields")
        return pos

    def owners(self, ids: np.ndarray) -> np.ndarray:
        """The rank that owns each of ``ids``."""
        return self.positions(ids) % self.world_size

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """This rank's slots of ``ids`` (its own, or its guests'); ValueError naming an id another rank owns."""
        pos = self.positions(ids)
        slots = pos // self.world_size
        foreign = pos % self.world_size != self.rank
        if foreign.any() and self.guests.size:
            ids = np.asarray(ids, dtype=np.int64)
            at = np.minimum(np.searchsorted(self.guests, ids[foreign]), self.guests.shape[0] - 1)
            hosted = self.guests[at] == ids[foreign]
            slots[np.flatnonzero(foreign)[hosted]] = self.owned + at[hosted]
            foreign[np.flatnonzero(foreign)[hosted]] = False
        if foreign.any():
            raise ValueError(
                f"sample id {int(np.asarray(ids)[foreign][0])} is owned by rank {int(pos[foreign][0] % self.world_size)}, "
                f"not by this rank ({self.rank} of {self.world_size}): its score cannot be kept here"
            )
        return slots
