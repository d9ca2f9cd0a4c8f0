"""Ranks as threads of one process: ``ThreadWorld`` stands in for ``torch.distributed``'s
collectives (a test patches them in), ``ThreadRanks`` for a ``RankGroup``; both let a test
run every rank side by side (thousands of plans) without processes."""

import threading
from collections.abc import Callable
from typing import Any

import torch

from tests.helpers.subprocess_limits import LIMIT_S


class ThreadWorld:
    """Ranks in threads of this process: ``torch.distributed``'s ``all_reduce`` (sum, min, max),
    ``all_gather``, ``all_gather_object``, ``broadcast``, ``broadcast_object_list`` and
    ``barrier`` combine what the threads pass, as gloo combines the processes' (``patch``
    puts them in place of ``torch.distributed``'s)."""

    def __init__(self, world):
        self.world = world
        self.local = threading.local()
        self.barrier = threading.Barrier(world, timeout=LIMIT_S)  # a hang fails the test; load never should
        self.parts = [None] * world
        self.merges = 0  # all-reduces of the [4, N] scores and flags

    def exchange(self, tensor):
        self.parts[self.local.rank] = tensor.clone()
        self.barrier.wait()
        parts = list(self.parts)
        self.barrier.wait()
        return parts

    def all_reduce(self, tensor, op=torch.distributed.ReduceOp.SUM, **_kw):
        parts = torch.stack(self.exchange(tensor))
        if op == torch.distributed.ReduceOp.MIN:
            tensor.copy_(parts.min(0).values)
        elif op == torch.distributed.ReduceOp.MAX:
            tensor.copy_(parts.max(0).values)
        else:
            assert op == torch.distributed.ReduceOp.SUM
            tensor.copy_(parts.sum(0))
        if self.local.rank == 0 and tensor.dim() == 2 and tensor.shape[0] == 4:
            self.merges += 1

    def all_gather(self, out, tensor, **_kw):
        for o, part in zip(out, self.exchange(tensor)):
            o.copy_(part)

    def all_gather_object(self, out, obj, **_kw):
        self.parts[self.local.rank] = obj
        self.barrier.wait()
        out[:] = list(self.parts)
        self.barrier.wait()

    def broadcast(self, tensor, src=0, **_kw):
        tensor.copy_(self.exchange(tensor)[src])

    def broadcast_object_list(self, objects, src=0, **_kw):
        self.parts[self.local.rank] = list(objects)
        self.barrier.wait()
        objects[:] = self.parts[src]
        self.barrier.wait()

    def barrier_wait(self, **_kw):
        self.barrier.wait()

    def patch(self, monkeypatch):
        """Make ``torch.distributed`` this world, as gloo's group of ``world`` processes
        looks to the code that asks it: initialised, this thread's rank, the collectives
        above. Patch again with another world to resume at another world size."""
        dist = torch.distributed
        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: self.world)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: self.local.rank)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
        monkeypatch.setattr(dist, "all_reduce", self.all_reduce)
        monkeypatch.setattr(dist, "all_gather", self.all_gather)
        monkeypatch.setattr(dist, "all_gather_object", self.all_gather_object)
        monkeypatch.setattr(dist, "broadcast", self.broadcast)
        monkeypatch.setattr(dist, "broadcast_object_list", self.broadcast_object_list)
        monkeypatch.setattr(dist, "barrier", self.barrier_wait)

    def run(self, fns):
        """``fns[r]()`` as rank ``r``, each in its own thread; returns their results."""
        errors, results = [], [None] * self.world

        def target(rank):
            self.local.rank = rank
            try:
                results[rank] = fns[rank]()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


class ThreadRanks:
    """One rank of a ``ThreadWorld``, with ``RankGroup``'s interface (``active``,
    ``world_size``, ``rank``, ``sum``, ``min_int``, ``all_gather_rows``, ``received_bytes``)."""

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.world = world
        self.world_size = world.world
        self.rank = rank
        self.active = world.world > 1
        self.device = torch.device("cpu")
        self.received_bytes = 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        self.received_bytes += t.numel() * t.element_size()
        return torch.stack(self.world.exchange(t)).sum(0)

    def min_int(self, value: int) -> int:
        self.received_bytes += 8
        return int(torch.stack(self.world.exchange(torch.tensor(value))).min())

    def all_gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        self.received_bytes += self.world_size * t.numel() * t.element_size()
        return torch.cat(self.world.exchange(t))


def run_ranks(world: int, work: Callable[[ThreadRanks], Any]) -> list[Any]:
    """``work(ranks)`` on ``world`` threads, one per rank; their results in rank order."""
    w = ThreadWorld(world)
    return w.run([lambda r=r: work(ThreadRanks(w, r)) for r in range(world)])
