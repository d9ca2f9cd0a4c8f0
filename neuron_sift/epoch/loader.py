"""``EpochSiftingDataloader``: epoch-level sifting from the losses training already computes.

At the start of each epoch the planner decides, from every sample's most recent training
loss, which samples the epoch trains on and in what order; the user's own DataLoader
settings deliver them through a batch sampler of ours, so skipped samples are never loaded
or forwarded. ``weighted_loss(per_sample)`` pairs the losses with the sample ids of their
batch (``pairing.py``), records them as scores and returns the weighted mean whose
expectation is the full-data loss (``policy.py``). No scoring forward, no patching.
"""

import logging
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from neuron_sift.backends import BACKEND_NAMES, resolve_backend
from neuron_sift.distributed import RankGroup
from neuron_sift.epoch.pairing import PairingQueue
from neuron_sift.epoch.planner import EpochPlan, EpochPlanner
from neuron_sift.epoch.source import PlannedBatchSampler, inspect_source, rebuild
from neuron_sift.epoch.tables import ScoreTables, merge_over_ranks
from neuron_sift.exceptions import LossOutputException
from neuron_sift.sift_config.epoch_config import coerce_epoch_config

logger = logging.getLogger(__name__)

STATE_VERSION = 1
_MASK63 = (1 << 63) - 1


class EpochSiftingDataloader:
    """Yields the user's own batches of the samples each epoch's plan keeps.

    ``sift_config``: an ``EpochSiftConfig`` or dict. ``orig_dataloader``: a DataLoader over a
    map-style dataset (or a wrapper such as ``MpDeviceLoader`` around one); its settings are
    kept, its sampling is replaced by the plan. ``num_epochs``: the run's length in epochs
    (needed for annealing and ``planned_steps()``; None: no annealing epochs).
    ``backend`` (``"eager"``, ``"xla"`` or None: follow the losses' device),
    ``distributed`` (None: follow ``torch.distributed``; True/False) as in
    ``SiftingDataloader``. ``device``: where the score tables live (default: the device of
    the first losses passed to ``weighted_loss``); also the collective device for nccl.

    Args:
        sift_config: an ``EpochSiftConfig`` or an equivalent dict.
        orig_dataloader: a ``torch.utils.data.DataLoader`` over a map-style dataset with a
            length and a batch size (or a wrapper such as ``MpDeviceLoader`` around one).
        num_epochs: the run's length in epochs (int >= 1), or None.
        backend: ``"eager"``, ``"compiled"``, ``"xla"`` or None to follow the losses' device.
        distributed: None follows ``torch.distributed``; True or False forces it.
        device: where the score tables live; None places them with the first losses.

    Iterating yields the source loader's own batches, of the samples the epoch's plan keeps,
    in the plan's order. Pass each batch's per-sample losses to ``weighted_loss``.

    Raises:
        SiftConfigValidationException: the config is invalid.
        TypeError: the source is not a DataLoader over a dataset with a length and a batch size.
        ValueError: an empty dataset, ``num_epochs`` not an int >= 1, or an unknown backend.
    """

    def __init__(
        self,
        sift_config: Any,
        orig_dataloader: Any,
        num_epochs: Optional[int] = None,
        *,
        backend: Optional[str] = None,
        distributed: Optional[bool] = None,
        device: Optional[Any] = None,
    ):
        self.sift_config = coerce_epoch_config(sift_config)
        if num_epochs is not None and (isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1):
            raise ValueError(f"num_epochs must be an int >= 1 or None, got {num_epochs!r}")
        self.num_epochs = num_epochs
        if backend is not None and backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES} or None, got {backend!r}")
        self._backend_name = backend
        self.orig_dataloader = orig_dataloader
        self._info = inspect_source(orig_dataloader)
        self.n = self._info.n
        dev = torch.device(device) if device is not None else None
        self.ranks = RankGroup(distributed, dev if dev is not None else torch.device("cpu"))
        seed = self.sift_config.seed
        if seed is None:
            seed = self._info.generator_seed if self._info.generator_seed is not None else torch.initial_seed()
        self.seed = int(seed) & _MASK63
        self.planner = EpochPlanner(
            self.sift_config,
            self.n,
            self._info.batch_size,
            self._info.drop_last,
            self.seed,
            num_epochs,
            self.ranks.world_size,
            self.ranks.rank,
        )
        self.tables = ScoreTables(self.n)
        self.backend = None
        if dev is not None:
            self._place(dev)
        self.pairing = PairingQueue()
        self._sampler = PlannedBatchSampler()
        self._loader = rebuild(orig_dataloader, self._info, self._sampler)
        self._epochs_started = 0
        self._plan: Optional[EpochPlan] = None
        self._batches: List[np.ndarray] = []
        self._position = 0  # batches of the current epoch whose losses are recorded
        self._yielded = 0
        self._in_progress = False
        self._resume = False
        self._planned_ahead = False  # start_epoch() planned the next epoch; iter() runs it
        self._token = 0
        self._mine = torch.zeros(self.n, dtype=torch.bool)  # trained here since the last merge
        self._carried = torch.zeros(self.n, dtype=torch.bool)  # recorded late, from the epoch before
        self._streak = torch.zeros(self.n, dtype=torch.int32)  # noise guard: epochs high in a row
        self.history: List[Dict[str, Any]] = []
        self.counts = {"losses_recorded": 0, "batches_recorded": 0, "batches_yielded": 0}
        self.timings = {"planning": 0.0, "weighted_loss": 0.0}

    # -- properties ----------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self._info.batch_size

    @property
    def epoch(self) -> int:
        """Epochs started so far (the current epoch is ``epoch - 1``, 0-based)."""
        return self._epochs_started

    @property
    def plan(self) -> Optional[EpochPlan]:
        """The current (or last) epoch's plan."""
        return self._plan

    @property
    def length_is_exact(self) -> bool:
        """Whether ``len()`` and ``planned_steps()`` are exact before each epoch starts: with a
        budget (``kept_share``), or when no epoch is sifted."""
        return self.sift_config.kept_share is not None

    def __len__(self) -> int:
        """This rank's batches of the current epoch while it runs (the remaining ones when a
        resume is pending); otherwise of the next epoch (exact for full and budgeted epochs,
        the expected count for an unbudgeted sifted epoch)."""
        if self._resume:
            return len(self._batches) - self._position
        if self._in_progress or self._planned_ahead:
            return len(self._batches)
        return self.planner.rank_batches(self.planner.expected_count(self._epochs_started))

    def planned_steps(self, epochs: Optional[int] = None) -> int:
        """Batches this rank trains from now on: the rest of an epoch in progress plus the next
        epochs, up to ``num_epochs`` (``epochs``: that many epochs, the one in progress counted
        first). Exact with a budget; for unbudgeted sifted epochs the expected count (the
        config's expected share, rounded to whole batches as the planner rounds).

        Args:
            epochs: how many epochs to count (int >= 1), or None for the rest of ``num_epochs``.

        Returns:
            The number of batches (optimizer steps without accumulation) this rank trains.

        Raises:
            ValueError: ``epochs`` is None and the loader has no ``num_epochs``, or ``epochs`` is
                not an int >= 1.
        """
        current = self._in_progress and self._position < len(self._batches)
        if epochs is None:
            if self.num_epochs is None:
                raise ValueError("planned_steps() needs num_epochs (given to the loader) or epochs=")
            future = range(self._epochs_started, self.num_epochs)
            total = len(self._batches) - self._position if current else 0
        else:
            if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
                raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
            total = len(self._batches) - self._position if current else 0
            future = range(self._epochs_started, self._epochs_started + epochs - (1 if current else 0))
        for e in future:
            total += self.planner.rank_batches(self.planner.expected_count(e))
        return total

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self):
        """A new epoch, planned at the first ``next()`` (or by ``start_epoch()`` before), or
        the epoch in progress after ``load_state_dict()``. Batches of the previous epoch that
        never got their losses are forgotten (counted in ``metrics()["unpaired_batches"]``,
        with a warning). An iterator that is never advanced plans nothing (Lightning calls
        ``iter()`` once just to check the loader)."""
        return self.iter_epoch()

    def start_epoch(self) -> EpochPlan:
        """Plan the next epoch now (``len()`` and ``plan`` then describe it); the next
        ``iter()`` runs it. Does nothing if an epoch is already planned and not yet iterated.

        Returns:
            The epoch's ``EpochPlan``.
        """
        if not self._planned_ahead and not self._resume:
            self._begin_epoch()
            self._planned_ahead = True
        return self._plan

    def iter_epoch(self, carry_pending: bool = False):
        """``iter(loader)``; with ``carry_pending=True`` the previous epoch's batches still
        waiting for their losses stay first in line: for wrappers that prefetch across
        epochs (``integrations.epoch_trainer.EpochStream``)."""
        self._token += 1
        return self._iterate(self._token, carry_pending)

    def _iterate(self, token: int, carry_pending: bool = False):
        if self._resume:
            self._resume = False
            start = self._position
        else:
            if not self._planned_ahead:
                self._begin_epoch()
            start = 0
        self._planned_ahead = False
        dropped = 0 if carry_pending else self.pairing.clear()
        if dropped:
            logger.warning(
                "EpochSiftingDataloader: %d yielded batch(es) never got their losses through weighted_loss; "
                "their samples keep their previous scores",
                dropped,
            )
        self._sampler.batches = self._batches
        self._sampler.start = start
        j = start
        for batch in self._loader:
            if token != self._token:
                raise RuntimeError("EpochSiftingDataloader: a new iteration was started; this iterator is no longer valid")
            self.pairing.push(self._batches[j], self._epochs_started)
            j += 1
            self._yielded = j
            self.counts["batches_yielded"] += 1
            yield batch
        if token == self._token:
            self._in_progress = False

    def _needs_scores(self, epoch: int) -> bool:
        """Whether epoch ``epoch``, or a later one, plans from scores (then ranks merge now)."""
        if epoch < 1:
            return False
        if self.num_epochs is None:
            return True
        last_sifted = self.num_epochs - self.sift_config.anneal_epochs(self.num_epochs)
        return epoch < last_sifted

    def _begin_epoch(self) -> None:
        start = time.perf_counter()
        e = self._epochs_started
        if self.num_epochs is not None and e == self.num_epochs:
            logger.warning("EpochSiftingDataloader: epoch %d is past num_epochs=%d; it trains on all data", e + 1, self.num_epochs)
        scores = None
        if self._needs_scores(e):
            local = self.tables.snapshot()  # the one host transfer of the epoch
            scores = merge_over_ranks(local, self._mine, self.ranks, self._carried)  # the one collective
            if self.ranks.active:
                self.tables.load_scores(scores)
            self._update_guard(scores)
            self._mine.zero_()
            self._carried.zero_()
        else:
            scores = torch.full((self.n,), float("nan"))
        excluded = None
        if self.sift_config.noise_guard_epochs > 0:
            excluded = self._streak >= self.sift_config.noise_guard_epochs
        plan = self.planner.plan(e, scores, excluded)
        self.tables.set_weights(plan.weights, e + 1)
        self._batches = self.planner.rank_batches_of(plan)
        if self._batches:
            self._mine[torch.from_numpy(np.concatenate(self._batches))] = True
        self._plan = plan
        self._epochs_started = e + 1
        self._position = 0
        self._yielded = 0
        self._in_progress = True
        elapsed = time.perf_counter() - start
        self.timings["planning"] += elapsed
        kept_w = plan.weights[plan.order] if plan.kept else torch.ones(1)
        entry = {
            "epoch": e,
            "kind": plan.kind,
            "kept": plan.kept,
            "kept_share": plan.kept / self.n,
            "mean_weight": float(kept_w.mean()),
            "max_weight": float(kept_w.max()),
            "batches": len(self._batches),
            "excluded": plan.excluded,
            "planning_seconds": elapsed,
        }
        self.history.append(entry)
        logger.info(
            "epoch %d (%s): %d of %d samples (%.3f), %d batches, mean weight %.3f, planned in %.4f s",
            e, plan.kind, plan.kept, self.n, entry["kept_share"], len(self._batches), entry["mean_weight"], elapsed,
        )

    def _update_guard(self, scores: torch.Tensor) -> None:
        """Noise guard: count, per sample trained last epoch, epochs in a row at or above the quantile."""
        cfg = self.sift_config
        if cfg.noise_guard_epochs <= 0 or self._plan is None:
            return
        seen = ~torch.isnan(scores)
        if not bool(seen.any()):
            return
        trained = torch.zeros(self.n, dtype=torch.bool)
        per_rank = len(self._plan.order) // self.ranks.world_size
        if self._info.drop_last:
            per_rank = (per_rank // self.batch_size) * self.batch_size
        trained[self._plan.order[: per_rank * self.ranks.world_size]] = True
        trained &= seen
        threshold = torch.quantile(scores[seen].to(torch.float64), cfg.noise_guard_quantile).to(torch.float32)
        high = scores >= threshold
        bumped = torch.where(high, self._streak + 1, torch.zeros_like(self._streak))
        self._streak = torch.where(trained, bumped, self._streak)

    # -- the loss ------------------------------------------------------------------------

    def _place(self, device: torch.device) -> None:
        self.backend = resolve_backend(device, self._backend_name)
        self.tables.place(device)

    def weighted_loss(self, per_sample: torch.Tensor, *, partial: bool = False) -> torch.Tensor:
        """Record ``per_sample`` (one loss per sample of the oldest batch still waiting) as the
        samples' scores and return the weighted mean ``sum(w_i * l_i) / n``.

        ``per_sample``: ``[n]`` (or ``[n, 1]``) floating losses, ``reduction="none"``, any
        precision (bf16/fp16 upcast to float32). ``partial=True``: this is a micro-batch, the
        next ``n`` samples of the waiting batch, in order. Non-finite losses are not recorded
        (counted in ``metrics()``) and stay in the returned mean, as without sifting.
        Raises ``LossOutputException`` on a wrong shape, length, dtype or device, or when no
        yielded batch is waiting (see ``neuron_sift/epoch/pairing.py``).

        Args:
            per_sample: the losses of the oldest batch still waiting, one per sample.
            partial: the losses are a micro-batch of that batch (the next ``n`` samples).

        Returns:
            A 0-dim tensor, the weighted mean to call ``backward()`` on; its expectation over the
            epoch's draws is the full-data mean loss.

        Raises:
            LossOutputException: a wrong shape, length, dtype or device, or no batch is waiting.
        """
        start = time.perf_counter()
        if not isinstance(per_sample, torch.Tensor):
            raise LossOutputException(f"weighted_loss needs a tensor of per-sample losses, got {type(per_sample).__name__}")
        shape = per_sample.shape
        if len(shape) == 2 and shape[1] == 1:
            per_sample = per_sample[:, 0]
            shape = per_sample.shape
        if len(shape) != 1:
            raise LossOutputException(
                f"weighted_loss needs one loss per sample, shape [n] (or [n, 1]), got {list(shape)}; "
                "use reduction='none' and reduce per-token losses to one value per sample"
            )
        if not per_sample.is_floating_point():
            raise LossOutputException(f"weighted_loss needs floating-point losses, got dtype {per_sample.dtype}")
        device = per_sample.device
        table_device = self.tables.device
        if table_device is None:
            self._place(device)
        elif device != table_device and not (
            device.type == table_device.type and None in (device.index, table_device.index)
        ):
            raise LossOutputException(f"weighted_loss got losses on {device} but the score tables live on {table_device}")
        ids, done, epoch = self.pairing.take(per_sample, shape[0], partial)
        out = self.tables.weighted_mean(ids, per_sample, epoch)
        counts = self.counts
        if epoch != self._epochs_started:  # a batch carried from the previous epoch
            self._carried[torch.from_numpy(ids)] = True
        if done:
            if epoch == self._epochs_started:
                self._position += 1
            counts["batches_recorded"] += 1
        counts["losses_recorded"] += ids.shape[0]
        self.timings["weighted_loss"] += time.perf_counter() - start
        return out

    # -- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything that decides the rest of the run, as CPU tensors and plain values (loads
        with ``torch.load(weights_only=True)``). Take it between training steps: a run resumed
        from it continues with the first batch whose losses were not recorded, with the same
        remaining batches, scores and draws."""
        plan = self._plan
        in_progress = self._in_progress and self._position < len(self._batches)
        return {
            "version": STATE_VERSION,
            "kind": "EpochSiftingDataloader",
            "policy": self.sift_config.policy,
            "kept_share": self.sift_config.kept_share,
            "n": self.n,
            "batch_size": self.batch_size,
            "rank": self.ranks.rank,
            "world_size": self.ranks.world_size,
            "seed": self.seed,
            "epochs_started": self._epochs_started,
            "in_progress": in_progress,
            "position": self._position,
            "plan": None
            if plan is None
            else {
                "epoch": plan.epoch,
                "kind": plan.kind,
                "order": plan.order.clone(),
                "weights": plan.weights.clone(),
                "inclusion": plan.inclusion.clone(),
                "excluded": plan.excluded,
            },
            "scores": self.tables.snapshot(),
            "nonfinite": self.tables.nonfinite(),
            "mine": self._mine.clone(),
            "carried": self._carried.clone(),
            "streak": self._streak.clone(),
            "history": [dict(h) for h in self.history],
            "counts": dict(self.counts),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()``; the next ``iter()`` continues where it was taken.

        Args:
            state: a dict returned by ``state_dict()`` of a loader with the same settings.

        Raises:
            ValueError: not an ``EpochSiftingDataloader`` state, or one taken with other settings.
        """
        if not isinstance(state, dict) or state.get("kind") != "EpochSiftingDataloader" or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an EpochSiftingDataloader state (version {STATE_VERSION} expected)")
        for key, mine in (("n", self.n), ("batch_size", self.batch_size), ("world_size", self.ranks.world_size),
                          ("rank", self.ranks.rank), ("policy", self.sift_config.policy),
                          ("kept_share", self.sift_config.kept_share)):
            if state[key] != mine:
                raise ValueError(f"checkpoint has {key}={state[key]!r} but this loader has {mine!r}")
        self.seed = int(state["seed"])
        self.planner.seed = self.seed
        self._epochs_started = int(state["epochs_started"])
        self._position = int(state["position"])
        p = state["plan"]
        self._plan = None if p is None else EpochPlan(
            int(p["epoch"]), p["kind"], p["order"].clone(), p["weights"].clone(), p["inclusion"].clone(), int(p["excluded"])
        )
        self._batches = self.planner.rank_batches_of(self._plan) if self._plan is not None else []
        self.tables.load_scores(state["scores"])
        self.tables.set_nonfinite(int(state["nonfinite"]))
        if self._plan is not None:
            self.tables.set_weights(self._plan.weights, self._epochs_started)
        self._mine = state["mine"].clone()
        self._carried = state["carried"].clone()
        self._streak = state["streak"].clone()
        self.history = [dict(h) for h in state["history"]]
        self.counts = dict(state["counts"])
        self._in_progress = bool(state["in_progress"])
        self._resume = self._in_progress
        self._yielded = self._position
        self._planned_ahead = False
        self.pairing.clear()
        self.pairing.dropped_batches = 0
        self._token += 1  # iterators started before loading are void

    # -- inspection ----------------------------------------------------------------------

    @property
    def machinery_seconds(self) -> float:
        """Host seconds in sifting's own work: planning plus ``weighted_loss`` (which includes
        the weighted mean the loop would compute anyway)."""
        return self.timings["planning"] + self.timings["weighted_loss"]

    def metrics(self) -> dict:
        """Counts, the current plan and the table (one host read of the scores on a device)."""
        scores = self.tables.snapshot()
        last = self.history[-1] if self.history else {}
        return {
            "epoch": self._epochs_started,
            "epoch_kind": last.get("kind"),
            "kept_share": last.get("kept_share", 1.0),
            "mean_weight": last.get("mean_weight", 1.0),
            "max_weight": last.get("max_weight", 1.0),
            "batches_planned": len(self._batches),
            "batches_yielded": self.counts["batches_yielded"],
            "batches_recorded": self.counts["batches_recorded"],
            "losses_recorded": self.counts["losses_recorded"],
            "scores_recorded": int((~torch.isnan(scores)).sum()),
            "num_nonfinite_losses": self.tables.nonfinite(),
            "unpaired_batches": self.pairing.dropped_batches,
            "excluded_by_guard": last.get("excluded", 0),
            "planning_seconds": self.timings["planning"],
            "weighted_loss_seconds": self.timings["weighted_loss"],
            "machinery_seconds": self.machinery_seconds,
            "epochs": [dict(h) for h in self.history],
        }
