"""Runs of ``EpochSiftingDataloader`` as users run them on several data-parallel ranks, with the
ranks as threads of this process (``thread_ranks.ThreadWorld`` in place of
``torch.distributed``): a few epochs of a tiny dataset, a loss that is a function of the
sample and the epoch (so no model is needed and a resumed run records the very losses of the
uninterrupted one), every rank's ``state_dict()`` taken mid-epoch or after an epoch's end and
loaded with ``load_state_dict_from_ranks`` on another world, and what a user could look at
recorded by sample id, merged over ranks: the weight each sample's loss got (from the
gradient, as training sees it), the scores, streaks, plan and ``metrics()`` each epoch opened
with, and every rank's history.
"""

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld

N, BATCH, EPOCHS = 96, 4, 5  # warm-up, three sifted epochs, one annealing epoch (anneal_fraction=0.2)
CONFIG = {"seed": 3, "kept_share": 0.5, "anneal_fraction": 0.2, **PRUNE_FROM_THE_START}


def epoch_loss(ids: torch.Tensor, epoch: int) -> torch.Tensor:
    """A loss that grows with the epoch: a score names the epoch it was recorded in."""
    return ((ids.double() * 7919 % 1009) / 1009 + 0.25 * epoch + 0.001).float()


def fixed_loss(ids: torch.Tensor, epoch: int) -> torch.Tensor:
    """The same loss in every epoch: every sifted epoch plans from the same scores."""
    return epoch_loss(ids, 0)


@dataclass(frozen=True)
class Stop:
    """Where a run stops and every rank takes its state: in epoch ``epoch`` after ``batches``
    batches of this run (None: once the epoch's iteration has ended)."""

    epoch: int
    batches: int | None


@dataclass
class Batch:
    """A trained batch: its epoch (0-based), rank, ids, and each sample's loss weight."""

    epoch: int
    rank: int
    ids: list[int]
    weights: list[float]
    opened: int  # epochs this rank's run had opened when the losses were passed (a look-ahead loop: more)


@dataclass
class Opening:
    """What a rank held when an epoch opened (planned afresh, not resumed): by sample id."""

    epoch: int
    rank: int
    ids: np.ndarray  # the ids of this rank's table entries (a sharded table: the owned samples)
    scores: torch.Tensor
    streaks: torch.Tensor  # empty with the guard off
    weights: torch.Tensor  # the plan's loss weights
    plan: list[int]  # the plan's ids this rank holds (a sharded plan: this rank's)
    metrics: dict[str, Any]


@dataclass
class Run:
    """Every rank's record of one run (one world, up to its stop)."""

    world: int
    sharded: bool
    batches: list[Batch] = field(default_factory=list)
    openings: list[Opening] = field(default_factory=list)
    history: list[list[dict[str, Any]]] = field(default_factory=list)  # per rank, where the run ended
    states: list[dict[str, Any]] | None = None  # per rank, where it stopped

    def of_epoch(self, epoch: int) -> list[Batch]:
        return [b for b in self.batches if b.epoch == epoch]

    def trained(self, epoch: int) -> list[int]:
        return [i for b in self.of_epoch(epoch) for i in b.ids]

    def weights(self, epoch: int) -> dict[int, float]:
        """Each sample's loss weight in ``epoch`` (each trained once there)."""
        return {i: w for b in self.of_epoch(epoch) for i, w in zip(b.ids, b.weights)}

    def steps(self, epoch: int) -> list[int]:
        """Batches of ``epoch`` on each rank."""
        return [sum(1 for b in self.of_epoch(epoch) if b.rank == r) for r in range(self.world)]

    def opened(self, epoch: int) -> list[Opening]:
        return [o for o in self.openings if o.epoch == epoch]

    def by_id(self, epoch: int, what: str, n: int = N) -> torch.Tensor:
        """``what`` (``scores``, ``streaks`` or ``weights``) of every sample when ``epoch``
        opened, merged over ranks; ranks holding the same sample (a replicated table) must agree."""
        parts = [(torch.from_numpy(o.ids), getattr(o, what)) for o in self.opened(epoch)]
        assert parts, f"epoch {epoch} was not opened in this run"
        out = torch.full((n,), float("nan"), dtype=torch.float64)
        seen = torch.zeros(n, dtype=torch.bool)
        for ids, values in parts:
            values = values.to(torch.float64)
            both = seen[ids]
            torch.testing.assert_close(out[ids][both], values[both], rtol=0, atol=0, equal_nan=True)
            out[ids] = values
            seen[ids] = True
        assert seen.all(), f"no rank holds samples {torch.flatnonzero(~seen).tolist()[:5]}"
        return out

    def plan_ids(self, epoch: int) -> list[int]:
        """The epoch's plan over all ranks: every rank's own under a sharded table; the one
        plan every rank holds under a replicated table."""
        plans = [o.plan for o in sorted(self.opened(epoch), key=lambda o: o.rank)]
        if self.sharded:
            return [i for p in plans for i in p]
        assert all(p == plans[0] for p in plans), f"the ranks hold different plans of epoch {epoch}"
        return plans[0]


def _table_ids(loader: EpochSiftingDataloader) -> np.ndarray:
    planner = loader.planner
    if isinstance(planner, ShardedPlanner):
        return planner.owner.ids()[: planner.owner.owned]
    return np.arange(planner.n)


class _Recorder:
    def __init__(self, run: Run, rank: int, loss: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
        self.run, self.rank, self.loss = run, rank, loss
        self.opened = 0

    def opening(self, loader: EpochSiftingDataloader) -> None:
        self.opened += 1
        ids = _table_ids(loader)
        plan = loader.plan
        self.run.openings.append(
            Opening(
                plan.epoch,
                self.rank,
                ids,
                loader.tables.snapshot()[: len(ids)].clone(),
                loader.guard.streak.clone(),
                plan.weights[: len(ids)].clone(),
                [int(i) for i in plan.order],
                loader.metrics(),
            )
        )

    def train(self, loader: EpochSiftingDataloader, x: torch.Tensor, epoch: int) -> None:
        ids = torch.tensor(ids_of(x))
        per_sample = self.loss(ids, epoch).requires_grad_()
        loader.weighted_loss(per_sample).backward()
        weights = (per_sample.grad * len(ids)).tolist()
        self.run.batches.append(Batch(epoch, self.rank, ids.tolist(), weights, self.opened))


def _loop(loader, rec: _Recorder, stop: Stop | None, epochs: int) -> dict[str, Any] | None:
    """The user's loop: ``for batch in loader``, epoch after epoch (a resumed epoch first)."""
    while loader.epoch < epochs or loader.resuming:
        fresh, here = not loader.resuming, 0
        for x, _y in loader:
            epoch = loader.plan.epoch
            if fresh and here == 0:
                rec.opening(loader)
            rec.train(loader, x, epoch)
            here += 1
            if stop is not None and (stop.epoch, stop.batches) == (epoch, here):
                return loader.state_dict()
        if stop is not None and stop.batches is None and loader.plan.epoch == stop.epoch:
            return loader.state_dict()
    return None


def _loop_ahead(loader, rec: _Recorder, depth: int, epochs: int) -> None:
    """A prefetching loop: each batch's losses are passed ``depth`` batches after it was
    yielded, across epochs (``iter_epoch(carry_pending=True)``), so an epoch's last batches
    get theirs after the next epoch opened."""
    pending: deque[tuple[torch.Tensor, int]] = deque()
    while loader.epoch < epochs:
        first = True
        for x, _y in loader.iter_epoch(carry_pending=True):
            if first:
                rec.opening(loader)
                first = False
            pending.append((x, loader.plan.epoch))
            if len(pending) > depth:
                rec.train(loader, *pending.popleft())
    while pending:
        rec.train(loader, *pending.popleft())


def train(
    monkeypatch,
    world: int,
    config: dict[str, Any] | None = None,
    *,
    states: list[dict[str, Any]] | None = None,
    stop: Stop | None = None,
    loss: Callable[[torch.Tensor, int], torch.Tensor] = epoch_loss,
    ahead: int = 0,
    n: int = N,
    epochs: int = EPOCHS,
    drop_last: bool = False,
    loader_kwargs: dict[str, Any] | None = None,
) -> Run:
    """Train ``world`` thread ranks with ``config`` (over ``CONFIG``), resumed from every old
    rank's ``states`` when given, up to ``stop`` (every rank's state then in ``Run.states``)
    or to the end; ``ahead``: a prefetching loop passing each batch's losses that many
    batches late."""
    cfg = {**CONFIG, **(config or {})}
    w = ThreadWorld(world)
    w.patch(monkeypatch)
    run = Run(
        world,
        cfg.get("score_table") == "sharded",
        history=[[] for _ in range(world)],
    )
    taken: list[Any] = [None] * world

    def rank(r: int) -> None:
        dl = DataLoader(IdDataset(n), batch_size=BATCH, shuffle=True, drop_last=drop_last)
        loader = EpochSiftingDataloader(cfg, dl, num_epochs=epochs, **(loader_kwargs or {}))
        assert (loader.planner.world_size, loader.planner.rank) == (world, r)  # the threads are the ranks
        if states is not None:
            loader.load_state_dict_from_ranks([roundtrip(s) for s in states])
        rec = _Recorder(run, r, loss)
        if ahead:
            _loop_ahead(loader, rec, ahead, epochs)
        else:
            taken[r] = _loop(loader, rec, stop, epochs)
        run.history[r] = [dict(h) for h in loader.history]

    w.run([lambda r=r: rank(r) for r in range(world)])
    if stop is not None:
        assert all(s is not None for s in taken), f"the run ended before {stop}"
        run.states = [roundtrip(s) for s in taken]
    return run


def segments(monkeypatch, worlds: list[int], stops: list[Stop], config=None, **kw) -> list[Run]:
    """A run on ``worlds[0]`` ranks stopped at ``stops[0]``, resumed on ``worlds[1]`` from every
    rank's state, stopped at ``stops[1]`` (if any), and so on: the last one runs to the end."""
    runs: list[Run] = []
    for i, world in enumerate(worlds):
        stop = stops[i] if i < len(stops) else None
        runs.append(train(monkeypatch, world, config, states=runs[-1].states if runs else None, stop=stop, **kw))
    return runs


def joined(runs: list[Run], epoch: int) -> tuple[list[int], dict[int, float]]:
    """The ids ``epoch`` trained over every run (repeats kept) and each sample's weights."""
    ids = [i for r in runs for i in r.trained(epoch)]
    weights = {i: w for r in runs for i, w in r.weights(epoch).items()}
    return ids, weights


@dataclass
class GuardAtOpening:
    """The noise guard as documented, at one epoch's opening: the streaks by id, the threshold
    (the lowest score with at least a ``q`` share of the scores at or below it) and the samples
    the plan leaves out (a streak of ``epochs`` and a score above the threshold)."""

    streaks: torch.Tensor
    threshold: float | None
    excluded: set[int]


def expected_guard(
    batches: list[Batch], openings: list[int], n: int, q: float, epochs: int, loss=epoch_loss
) -> dict[int, GuardAtOpening]:
    """The noise guard at each of ``openings`` (every epoch whose opening plans from scores,
    ascending: the guard moves there), computed from the batches trained alone as the guard is
    documented: at each opening, a sample trained in the epoch before extends its streak if its
    score (its last loss) is above the threshold of all scores, else its streak resets; others
    keep theirs; the plan leaves out the samples with a streak of ``epochs`` whose score is above
    the threshold."""
    streak = torch.zeros(n, dtype=torch.int64)
    scores = torch.full((n,), float("nan"))
    out = {}
    threshold = None
    for epoch in range(max(openings) + 1):
        trained = torch.tensor(sorted({i for b in batches if b.epoch == epoch - 1 for i in b.ids}), dtype=torch.long)
        if epoch in openings:
            seen = torch.sort(scores[~torch.isnan(scores)]).values
            threshold = float(seen[math.ceil(q * seen.numel()) - 1]) if seen.numel() else None
        if epoch in openings and trained.numel() and threshold is not None:
            high = scores[trained] > threshold
            streak[trained] = torch.where(high, streak[trained] + 1, torch.zeros_like(streak[trained]))
        if epoch in openings:
            above = scores > threshold if threshold is not None else torch.zeros(n, dtype=torch.bool)
            excluded = {int(i) for i in torch.nonzero((streak >= epochs) & above).flatten()}
            out[epoch] = GuardAtOpening(streak.clone(), threshold, excluded)
        for b in batches:
            if b.epoch == epoch:
                scores[torch.tensor(b.ids)] = loss(torch.tensor(b.ids), epoch)
    return out
