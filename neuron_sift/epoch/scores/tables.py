"""This rank's score and weight tensors, where the losses live: host arrays where the backend
keeps state on the host (a CPU model), device tensors otherwise (XLA, CUDA). One class under
either kind of score table (the kinds and what each builds: the registry, ``score_table.py``):
a kind decides how many entries this rank holds and what they index (its planner's
``table_size`` and ``slots``).

Why two homes: on a device, reading a loss back each step would stall the training loop,
so each step is one static-shape scatter of the batch's losses into the score table
(non-finite ones into the trash slot, counted) and one gather of the batch's weights, with
nothing read back; the scores cross to the host once per epoch (``snapshot``) to plan the
next one. On the host the same writes are plain array stores, deferred and batched.

Why a deferred write watches the losses' version counter: on the host the scores are read
from the loss tensors at the next flush, not at ``weighted_loss``, so a loss tensor changed
in place after the call (``per_sample.clamp_(...)``) would record the changed values. Each
pending tensor keeps its version at the call; a flush that finds another version warns
once. On a device the write is queued at the call (eagerly, or into the lazy graph on XLA),
so a later in-place change does not reach the recorded scores and nothing is checked.

With ``partial=True`` each micro-batch returns ``sum(w_i * l_i) / n_batch`` over its own
samples, ``n_batch`` being the whole batch's size: the parts of a batch sum to the batch's
own value whatever their sizes, so summing (or backpropagating each part) gives the
gradient of the whole batch without any scaling by the caller.
"""

import logging
from typing import Any, cast

import numpy as np
import torch

from neuron_sift.backends.base import Backend
from neuron_sift.kernels.scores import gather_weights, score_writes, smoothed, weighted_mean
from neuron_sift.shared.logs import EPOCH_LOGGER
from neuron_sift.shared.state_checks import need_int, need_mapping, need_values, need_vector

logger = logging.getLogger(EPOCH_LOGGER)


def _version(t: torch.Tensor) -> int | None:
    """``t``'s in-place version counter; None for a tensor without one (inference mode)."""
    try:
        return int(t._version)
    except (RuntimeError, AttributeError):
        return None


class ScoreTables:
    """``N`` scores (NaN: never scored) plus a trash slot, and ``N`` loss weights.
    ``smoothing``: a sample's score is the moving average of its losses, each new loss
    weighted ``smoothing`` (``EpochSiftConfig.score_smoothing``); None: its last loss."""

    def __init__(self, n: int, smoothing: float | None = None) -> None:
        self.n = n
        self.smoothing = smoothing
        self.device: torch.device | None = None  # None until placed: host arrays meanwhile
        self._scores = np.full(n + 1, np.nan, dtype=np.float32)
        self._weights = np.ones(n, dtype=np.float32)
        self._uniform = True  # every weight is 1 (a full epoch)
        # host mode: recorded, not yet written, with each loss tensor's version at the call
        self._pending: list[tuple[np.ndarray, torch.Tensor, int | None, float | None]] = []
        self._changed_warned = False
        self._nonfinite = 0
        self._dev_scores: torch.Tensor | None = None
        self._dev_weights: torch.Tensor | None = None
        self._dev_nonfinite: torch.Tensor | None = None
        # (epoch, host weights, device weights) of the epoch before: its carried batches need them
        self._previous: tuple[int, np.ndarray, torch.Tensor | None] | None = None
        self.epoch = -1  # the 0-based epoch the weights are of (-1: none planned yet)

    @property
    def on_device(self) -> bool:
        return self._dev_scores is not None

    def place(self, backend: Backend) -> None:
        """Keep the tables where ``backend`` keeps state from now on; one upload to a device.
        The first placement holds: the tables never move between devices."""
        if self.device is not None:
            return
        self.device = backend.device
        if not backend.holds_on_host:
            self._dev_scores = torch.from_numpy(self._scores).to(backend.device)
            self._dev_weights = torch.from_numpy(self._weights).to(backend.device)
            self._dev_nonfinite = torch.tensor([self._nonfinite], dtype=torch.int64).to(backend.device)

    # -- per step ---------------------------------------------------------------------------

    def record(
        self, ids: np.ndarray, losses: torch.Tensor, epoch: int | None = None, smoothing: float | None = None
    ) -> torch.Tensor:
        """Record ``losses`` as the scores of ``ids``; returns their weights on the losses' device
        (those of ``epoch``: the current one, or the one before for a carried batch).
        ``smoothing``: this write's moving-average weight, over the table's own (a batch-level
        loss's, ``weighted_batch_loss``)."""
        return self._record(ids, losses, epoch, mean=False, smoothing=smoothing)

    def weighted_mean(
        self, ids: np.ndarray, losses: torch.Tensor, epoch: int | None = None, batch_size: int | None = None
    ) -> torch.Tensor:
        """``record``, then ``sum(w_i * l_i) / batch_size`` (``batch_size``: the whole batch's
        size when ``ids`` is a micro-batch of it; None: ``len(ids)``, the weighted mean)."""
        return self._record(ids, losses, epoch, mean=True, batch_size=batch_size)

    def _record(
        self,
        ids: np.ndarray,
        losses: torch.Tensor,
        epoch: int | None,
        mean: bool,
        batch_size: int | None = None,
        smoothing: float | None = None,
    ) -> torch.Tensor:
        part = batch_size is not None and batch_size != ids.shape[0]
        smoothing = self.smoothing if smoothing is None else smoothing
        host_w, dev_w = self._weights, self._dev_weights
        if epoch == self.epoch:
            # Losses arrive in yield order: once a batch of this epoch has them, no batch of the
            # epoch before can still come, so its weights (a table's worth) are let go.
            self._previous = None
        elif epoch is not None and self._previous is not None and self._previous[0] == epoch:
            host_w, dev_w = self._previous[1], self._previous[2]
        dev_scores, dev_nonfinite = self._dev_scores, self._dev_nonfinite
        if dev_scores is not None and dev_nonfinite is not None:
            dev_ids = torch.from_numpy(ids).to(self.device)
            slots, values, nonfinite = score_writes(dev_ids, losses, self.n)
            if smoothing is not None:  # the static-shape gather of the previous scores first
                values = smoothed(dev_scores.index_select(0, slots), values, smoothing)
            dev_scores.index_put_((slots,), values)
            dev_nonfinite.add_(nonfinite)
            w = gather_weights(cast(torch.Tensor, dev_w), dev_ids)
            if not mean:
                return w
            out = weighted_mean(losses, w)
            return out * (ids.shape[0] / cast(int, batch_size)) if part else out
        # Host arrays: the write is deferred to one vectorised store per flush (before any read).
        detached = losses.detach()
        self._pending.append((ids, detached, _version(detached), smoothing))
        if len(self._pending) >= 256:
            self.flush()
        n = batch_size if batch_size is not None else ids.shape[0]
        if mean and self._uniform and host_w is self._weights and losses.dtype == torch.float32:
            return losses.sum() / n if part else losses.mean()  # a full epoch: every weight is 1
        w = host_w[ids]
        if not mean:
            return torch.from_numpy(w)
        if losses.dtype == torch.float32:  # one op forward and backward: dot with w / n
            w *= np.float32(1.0 / n)
            return torch.dot(losses, torch.from_numpy(w))
        out = weighted_mean(losses, torch.from_numpy(w))
        return out * (ids.shape[0] / n) if part else out

    def flush(self) -> None:
        """Write the recorded losses still pending into the host table (one vectorised store)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self._changed_warned and any(v is not None and _version(t) != v for _, t, v, _s in pending):
            self._changed_warned = True
            logger.warning(
                "EpochSiftingDataloader: a loss tensor passed to weighted_loss was changed in place afterwards; on "
                "the host its scores are written later, so the changed values were recorded. Change a copy "
                "(per_sample.clone()) or change the losses before weighted_loss (this warning is shown once)"
            )
        if any(p[3] is not None for p in pending):  # batch by batch: a sample's losses enter its average in order
            for ids, tensor, _, smoothing in pending:
                self._store(ids, tensor.to(torch.float32).reshape(-1).numpy(), smoothing)
            return
        ids = np.concatenate([p[0] for p in pending])
        values = torch.cat([p[1].to(torch.float32).reshape(-1) for p in pending]).numpy()
        self._store(ids, values, None)

    def _store(self, ids: np.ndarray, values: np.ndarray, smoothing: float | None) -> None:
        """Write finite ``values`` at ``ids`` of the host table (averaged in with weight
        ``smoothing``); count the others."""
        finite = np.isfinite(values)
        if not finite.all():
            ids, values = ids[finite], values[finite]
            self._nonfinite += int((~finite).sum())
        if smoothing is not None:
            previous = torch.from_numpy(self._scores[ids])
            values = smoothed(previous, torch.from_numpy(values), smoothing).numpy()
        self._scores[ids] = values

    # -- per epoch --------------------------------------------------------------------------

    def snapshot(self) -> torch.Tensor:
        """The ``[N]`` scores as a CPU float32 tensor (on a device: the one host transfer)."""
        if self._dev_scores is not None:
            return self._dev_scores[: self.n].cpu()
        self.flush()
        return torch.from_numpy(self._scores[: self.n].copy())

    def load_scores(self, scores: torch.Tensor) -> None:
        """Replace the scores (after a merge over ranks, or from a checkpoint)."""
        self.flush()
        host = scores.detach().to(torch.float32).cpu().numpy()
        self._scores[: self.n] = host
        if self.on_device:
            full = torch.from_numpy(self._scores)
            self._dev_scores = full.to(self.device)

    def resize(self, n: int) -> None:
        """``n`` entries from now on, all unscored with unit weights (the caller loads what
        they hold): a sharded table grows by the samples it hosts for an epoch resumed at
        another world size and shrinks back when their scores go to their owners."""
        self.flush()
        if n == self.n:
            return
        self.n = n
        self._scores = np.full(n + 1, np.nan, dtype=np.float32)
        self._weights = np.ones(n, dtype=np.float32)
        self._uniform = True
        self._previous = None
        if self.on_device:
            self._dev_scores = torch.from_numpy(self._scores).to(self.device)
            self._dev_weights = torch.from_numpy(self._weights).to(self.device)

    def set_weights(self, weights: torch.Tensor, epoch: int, keep_previous: bool = False) -> None:
        """The loss weight of every sample for the coming ``epoch`` (0-based; one upload on a
        device); with ``keep_previous`` (batches of the epoch before still wait for their
        losses) the previous epoch's stay available for those carried batches, else they are
        let go at once: a table's worth of memory."""
        self._previous = (self.epoch, self._weights, self._dev_weights) if keep_previous else None
        self.epoch = epoch
        self._weights = weights.detach().to(torch.float32).cpu().numpy()  # the plan's own: never written here
        self._uniform = bool((self._weights == 1.0).all())
        if self.on_device:
            self._dev_weights = torch.from_numpy(self._weights).to(self.device)

    @property
    def weights(self) -> torch.Tensor:
        return torch.from_numpy(self._weights)

    def nonfinite(self) -> int:
        """Non-finite losses seen so far (one small read on a device)."""
        if self._dev_nonfinite is not None:
            return int(self._dev_nonfinite.cpu()[0])
        self.flush()
        return self._nonfinite

    def set_nonfinite(self, count: int) -> None:
        self.flush()
        self._nonfinite = int(count)
        if self.on_device:
            self._dev_nonfinite = torch.tensor([self._nonfinite], dtype=torch.int64).to(self.device)

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Scores and the non-finite count, on the CPU (one host read on a device). The weights
        are not kept: they follow from the plan in progress."""
        return {"scores": self.snapshot(), "nonfinite": self.nonfinite()}

    def check_state(self, state: Any) -> None:
        """Refuse a state that is not this table's ``n`` scores and a count."""
        self.check_sized(state, self.n)

    @staticmethod
    def check_sized(state: Any, size: int) -> None:
        """Refuse a state that is not ``size`` scores (finite, or NaN: never scored) and a count."""
        need_mapping(state, "tables", ("scores", "nonfinite"))
        scores = need_vector(state["scores"], "tables.scores", torch.float32, size, "entry of this rank's table")
        need_values(scores, "tables.scores", -np.inf, nan=True)  # any finite loss; never infinite
        need_int(state["nonfinite"], "tables.nonfinite", 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.load_scores(state["scores"])
        self.set_nonfinite(int(state["nonfinite"]))
