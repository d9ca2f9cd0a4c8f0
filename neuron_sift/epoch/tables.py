"""The score and weight tables, where the losses live: host arrays for a CPU model, device
tensors otherwise (XLA, CUDA).

Per training step: one static-shape scatter of the batch's losses into the score table
(non-finite ones into the trash slot, counted) and one gather of the batch's weights; on
a device nothing is read back. Per epoch: one host transfer of the score table to plan the
next epoch (``snapshot``) and one upload of the new weights. Under data parallelism,
``merge_over_ranks`` combines the ranks' tables with one all-reduce.
"""

from typing import Optional

import numpy as np
import torch

from neuron_sift.kernels.scores import gather_weights, score_writes


class ScoreTables:
    """``N`` scores (NaN: never scored) plus a trash slot, and ``N`` loss weights."""

    def __init__(self, n: int):
        self.n = n
        self.device: Optional[torch.device] = None  # None until placed: host arrays meanwhile
        self._scores = np.full(n + 1, np.nan, dtype=np.float32)
        self._weights = np.ones(n, dtype=np.float32)
        self._nonfinite = 0
        self._dev_scores: Optional[torch.Tensor] = None
        self._dev_weights: Optional[torch.Tensor] = None
        self._dev_nonfinite: Optional[torch.Tensor] = None

    @property
    def on_device(self) -> bool:
        return self._dev_scores is not None

    def place(self, device: torch.device) -> None:
        """Keep the tables on ``device`` from now on (host arrays for the CPU); one upload."""
        if self.device is not None:
            return
        self.device = device
        if device.type != "cpu":
            self._dev_scores = torch.from_numpy(self._scores).to(device)
            self._dev_weights = torch.from_numpy(self._weights).to(device)
            self._dev_nonfinite = torch.tensor([self._nonfinite], dtype=torch.int64).to(device)

    # -- per step ---------------------------------------------------------------------------

    def record(self, ids: np.ndarray, losses: torch.Tensor) -> torch.Tensor:
        """Record ``losses`` as the scores of ``ids``; returns their weights on the losses' device."""
        if self.on_device:
            dev_ids = torch.from_numpy(ids).to(self.device)
            slots, values, nonfinite = score_writes(dev_ids, losses, self.n)
            self._dev_scores.index_put_((slots,), values)
            self._dev_nonfinite.add_(nonfinite)
            return gather_weights(self._dev_weights, dev_ids)
        values = losses.detach().to(torch.float32).numpy()
        finite = np.isfinite(values)
        if finite.all():
            self._scores[ids] = values
        else:
            self._scores[ids[finite]] = values[finite]
            self._nonfinite += int((~finite).sum())
        return torch.from_numpy(self._weights[ids])

    # -- per epoch --------------------------------------------------------------------------

    def snapshot(self) -> torch.Tensor:
        """The ``[N]`` scores as a CPU float32 tensor (on a device: the one host transfer)."""
        if self.on_device:
            return self._dev_scores[: self.n].cpu()
        return torch.from_numpy(self._scores[: self.n].copy())

    def load_scores(self, scores: torch.Tensor) -> None:
        """Replace the scores (after a merge over ranks, or from a checkpoint)."""
        host = scores.detach().to(torch.float32).cpu().numpy()
        self._scores[: self.n] = host
        if self.on_device:
            full = torch.from_numpy(self._scores)
            self._dev_scores = full.to(self.device)

    def set_weights(self, weights: torch.Tensor) -> None:
        """The loss weight of every sample for the coming epoch (one upload on a device)."""
        self._weights = weights.detach().to(torch.float32).cpu().numpy().copy()
        if self.on_device:
            self._dev_weights = torch.from_numpy(self._weights).to(self.device)

    @property
    def weights(self) -> torch.Tensor:
        return torch.from_numpy(self._weights)

    def nonfinite(self) -> int:
        """Non-finite losses seen so far (one small read on a device)."""
        if self.on_device:
            return int(self._dev_nonfinite.cpu()[0])
        return self._nonfinite

    def set_nonfinite(self, count: int) -> None:
        self._nonfinite = int(count)
        if self.on_device:
            self._dev_nonfinite = torch.tensor([self._nonfinite], dtype=torch.int64).to(self.device)


def merge_over_ranks(scores: torch.Tensor, mine: torch.Tensor, ranks) -> torch.Tensor:
    """Every rank's scores for the samples it trained on since the last merge, combined.

    ``scores``: this rank's ``[N]`` table (CPU); ``mine``: ``[N]`` bool, the samples this
    rank trained on (each sample belongs to one rank per epoch). One all-reduce of a
    ``[2, N]`` float32 tensor (the scored values and a flag); entries no rank scored keep
    the value every rank already shares.
    """
    if not ranks.active:
        return scores
    scored = mine & ~torch.isnan(scores)
    parts = torch.stack([torch.where(scored, scores, torch.zeros_like(scores)), scored.to(torch.float32)])
    import torch.distributed as dist

    buf = parts.to(ranks.device)
    dist.all_reduce(buf)
    buf = buf.cpu()
    return torch.where(buf[1] > 0, buf[0], scores)
