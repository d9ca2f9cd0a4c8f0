"""Dealing the rest of an epoch out to ranks, when it is resumed at another world size.

Why its own rule: a plan shares its order out as every ``W``-th id from each rank, so each
rank knows its batches without asking the others. After a resume at ``W'`` ranks the ids
left are no longer a multiple of anything, yet data parallelism steps in lockstep: every
rank must run the same number of batches, and no sample may be dropped or trained twice.
So the rest is dealt one id per rank in turn (shares differ by at most one sample) and cut
into batches of the batch size; a rank whose share is one sample short of another's
extra batch splits its own last batch in two. Every rank computes its batches from the
same ``rest``, so they agree without a collective.
"""

import numpy as np


def deal_rest(rest: np.ndarray, world_size: int, rank: int, batch_size: int) -> list[np.ndarray]:
    """Rank ``rank``'s batches of ``rest`` (ids in training order) over ``world_size`` ranks,
    the same number of batches on every rank; a ValueError where that cannot be done without
    dropping or repeating a sample (fewer samples left than ranks; batches of one sample
    with shares of unequal size)."""
    left, w, b = int(rest.shape[0]), world_size, batch_size
    if left == 0:
        return []
    if left < w:
        raise ValueError(
            f"the epoch in progress has {left} samples left, fewer than the {w} ranks: resume it with at most "
            f"{left} ranks, or from a checkpoint taken after the epoch ended"
        )
    if b == 1 and left % w:
        raise ValueError(
            f"the epoch in progress has {left} samples left, not a multiple of the {w} ranks, and batches of one "
            "sample cannot be split to give every rank the same number of steps: resume it with a world size "
            "that divides the samples left, or from a checkpoint taken after the epoch ended"
        )
    mine = rest[rank::w]
    most = -(-left // w)  # samples of the ranks with the most
    count = -(-most // b)  # their batches
    batches = [mine[i : i + b] for i in range(0, mine.shape[0], b)]
    if len(batches) < count:  # one sample short of another batch: split the last in two
        last = batches.pop()
        half = last.shape[0] // 2
        batches += [last[:half], last[half:]]
    return batches
