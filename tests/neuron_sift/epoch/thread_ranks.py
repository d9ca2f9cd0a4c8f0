"""``W`` ranks as threads of one process, with the collectives ``RankGroup`` offers: lets a
test run every rank's planner side by side (thousands of plans) without processes."""

import threading
from collections.abc import Callable
from typing import Any

import torch


class Meeting:
    """Where the threads' collectives meet: each puts its value, all read everyone's."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.values: list[Any] = [None] * world

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.values[rank] = value
        self.barrier.wait()
        out = list(self.values)
        self.barrier.wait()
        return out


class ThreadRanks:
    """One rank of a ``Meeting``: ``RankGroup``'s interface (``active``, ``world_size``,
    ``rank``, ``sum``, ``min_int``, ``all_gather_rows``, ``received_bytes``)."""

    def __init__(self, meeting: Meeting, rank: int) -> None:
        self.meeting = meeting
        self.world_size = meeting.world
        self.rank = rank
        self.active = meeting.world > 1
        self.device = torch.device("cpu")
        self.received_bytes = 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        parts = self.meeting.exchange(self.rank, t.clone())
        self.received_bytes += t.numel() * t.element_size()
        return torch.stack(parts).sum(0)

    def min_int(self, value: int) -> int:
        self.received_bytes += 8
        return min(self.meeting.exchange(self.rank, int(value)))

    def all_gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        parts = self.meeting.exchange(self.rank, t.clone())
        self.received_bytes += self.world_size * t.numel() * t.element_size()
        return torch.cat(parts)


def run_ranks(world: int, work: Callable[[ThreadRanks], Any]) -> list[Any]:
    """``work(ranks)`` on ``world`` threads, one per rank; their results in rank order (the
    first exception re-raised, the others' barrier broken so that nothing hangs)."""
    meeting = Meeting(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            results[rank] = work(ThreadRanks(meeting, rank))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)
            meeting.barrier.abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
