"""Data-parallel coordination over ``torch.distributed`` (gloo on CPU, nccl, or ``xla``).

Why: each rank keeps a different number of samples in probabilistic mode, so without
coordination ranks emit different numbers of batches per epoch, and the rank with more
batches waits forever in DDP's gradient all-reduce. Every collective here is small and
has a static shape, and all ranks call it at the same points: ranks must see the same
number of source batches per epoch (``DistributedSampler`` guarantees this, padding or
dropping so every rank gets the same number of samples). Every collective of the package
goes through ``RankGroup``: both modes, one place to read what crosses ranks.
"""

import torch
import torch.distributed as dist


class RankGroup:
    """The process group sifting coordinates over, or a no-op for a single process.

    ``received_bytes``: what the collectives delivered to this rank so far (an integer kept
    on the host from the tensors' shapes, no device read), so a run can state what its
    coordination costs (the benchmarks report it)."""

    def __init__(self, enabled: bool | None, device: torch.device):
        active = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if enabled and not active:
            raise RuntimeError("distributed=True but torch.distributed is not initialised with more than one rank")
        self.active = active if enabled is None else (bool(enabled) and active)
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1
        self.device = self._collective_device(device) if self.active else torch.device("cpu")
        self.received_bytes = 0

    @staticmethod
    def _collective_device(device: torch.device) -> torch.device:
        """gloo reduces CPU tensors; nccl CUDA tensors; the xla group XLA tensors."""
        backend = str(dist.get_backend())
        if backend == "gloo":
            return torch.device("cpu")
        return device

    def min_int(self, value: int) -> int:
        """The minimum of ``value`` over ranks: one all-reduce of one int64 (8 bytes)."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        self.received_bytes += 8
        return int(t.cpu()[0])

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (same static shape on every rank) summed over ranks: one all-reduce."""
        if not self.active:
            return t
        buf = t.to(self.device)
        dist.all_reduce(buf)
        self.received_bytes += buf.numel() * buf.element_size()
        return buf.to(t.device)

    def all_gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (same static shape on every rank) from all ranks, concatenated in rank order."""
        if not self.active:
            return t
        src = t.to(self.device)
        parts = [torch.empty_like(src) for _ in range(self.world_size)]
        dist.all_gather(parts, src)
        self.received_bytes += self.world_size * src.numel() * src.element_size()
        return torch.cat(parts).to(t.device)
