"""The suite's arms, and the registry that new arms plug into.

An arm is one way to train a task's model: a function ``arm(ctx) -> dict`` registered
under its name. ``benchmarks/runner.py`` builds the ``ArmContext`` (``context.py``: the
model with the seed's initial weights, the optimizer, the seeded data, the clock) and times
the call; the arm runs its training loop and reports each optimizer step with ``ctx.trained``:

    from arms import register                      # benchmarks/ is on sys.path, not a package

    @register("my-arm", default=False, description="what it trains on")
    def my_arm(ctx):
        loader = ctx.source                        # or a DataLoader over ctx.dataset and ctx.order(epoch)
        sched = ctx.step_schedule(ctx.epochs * len(loader))   # cosine to 0 at the arm's own end
        for epoch in range(ctx.epochs):            # (or ctx.epoch_schedule(epochs) when epoch lengths vary)
            for x, y, ids in loader:
                x, y = ctx.to_device(x, y)
                per_sample = F.cross_entropy(ctx.model(x), y, reduction="none")
                ctx.optimizer.zero_grad(set_to_none=True)
                per_sample.mean().backward(); ctx.optimizer.step(); sched.step()
                ctx.trained(ids, seen=...)         # source samples passed over so far; evaluates (clock paused)
            ctx.end_epoch()
        return {"samples_kept": ..., "scoring_forward_samples": 0}   # and any extra result keys

``ArmContext`` gives: ``task``, ``data``, ``seed``, ``device``, ``epochs`` (the task's, i.e.
``full``'s), ``beta`` (the kept-share knob of the uniform and sifting arms), ``model`` (on
``device``, train mode), ``optimizer`` (Adam, the task's lr), ``dataset`` (CPU
``TensorDataset(x, y, index)``), ``source`` (a ``DataLoader`` over it, batch size
``task.batch_size``, in the seed's order), ``order(epoch)`` (that order: one permutation
per seed and epoch, the same for every arm), ``step_schedule(total_steps)`` and
``epoch_schedule(epochs)`` (the cosine learning-rate schedule, decayed to the arm's own
end), ``clock`` (wall-clock, paused by the runner while it evaluates), ``evaluate()`` (test
accuracy now, clock paused), ``trained(ids, seen)`` after every optimizer step (counts the
trained samples and evaluates at every ``1 / evals_per_epoch`` epoch of ``seen``),
``end_epoch()`` after each pass. The returned dict may set ``samples_kept`` (default:
samples trained), ``scoring_forward_samples`` (default 0), ``planned_steps`` (default: the
schedule's) and any extra keys, which land in the run's results. The loops the arms here
share (the plain loop, one loss-weighted epoch over a planned subset, one optimizer step)
are in ``loops.py``. An arm over a sifting loader sizes its schedule with the library's
plan (``neuron_sift.integrations.schedules.planned_steps``, an ``EpochSiftingDataloader``'s
``planned_steps()``), never with a count of its own.

Registering: ``register(name, fn, default=..., description=...)`` or the decorator form;
``default=True`` adds the arm to the suite's default ``--arms``. Any file
``benchmarks/*_arms.py`` is imported by the suite (``load_plugins``) so that its
``register`` calls run: that is how ``epoch_arms.py`` adds its arms. ``full@X`` for any X
in (0, 1] is resolved on demand (``get_arm``): the full-data frontier.

The arms here: ``full@0.4``, ``full@0.6``, ``full@0.8``, ``full`` (= ``full@1.0``),
``uniform``, ``sift-probabilistic``, ``sift-fixed`` and ``infobatch`` (see
``infobatch.py``: a reimplementation of the published rule, not InfoBatch's code).
"""

import importlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from context import ArmContext
from loops import train_plain
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.integrations.schedules import planned_steps
from neuron_sift.loss.abstract_sift_loss_module import Loss
from neuron_sift.sift_config.sift_configs import LossConfig, RelativeProbabilisticSiftConfig, SiftingBaseConfig


@dataclass
class ArmSpec:
    name: str
    fn: Callable
    default: bool
    description: str
    frontier: float = 0.0  # > 0: a full-data run of this fraction of the epochs


ARMS: dict[str, ArmSpec] = {}


def register(
    name: str, fn: Callable | None = None, *, default: bool = False, description: str = "", frontier: float = 0.0
) -> Callable:
    """Register ``fn`` as arm ``name`` (also usable as a decorator). A name already taken is an error."""

    def add(f: Callable) -> Callable:
        if name in ARMS:
            raise ValueError(f"arm {name!r} is already registered")
        ARMS[name] = ArmSpec(name, f, default, description, frontier)
        return f

    return add(fn) if fn is not None else add


_FULL = re.compile(r"^full@(\d+(?:\.\d*)?|\.\d+)$")


def get_arm(name: str) -> ArmSpec:
    """The registered arm, or a ``full@X`` frontier arm for any fraction X in (0, 1]."""
    if name in ARMS:
        return ARMS[name]
    m = _FULL.match(name)
    if m and 0.0 < float(m.group(1)) <= 1.0:
        x = float(m.group(1))
        return ArmSpec(name, _full_arm(x), False, f"all data for {x:g} of the epochs", frontier=x)
    raise KeyError(name)


def default_arms() -> list[str]:
    return [name for name, spec in ARMS.items() if spec.default]


def load_plugins() -> list[str]:
    """Import every ``benchmarks/*_arms.py`` (their ``register`` calls add arms)."""
    names = sorted(p.stem for p in Path(__file__).resolve().parent.glob("*_arms.py"))
    for name in names:
        importlib.import_module(name)
    return names


def frontier_epochs(fraction: float, epochs: int) -> int:
    """``fraction`` of ``epochs``, rounded up (at least 1)."""
    return max(1, math.ceil(round(fraction * epochs, 9)))


# ---------------------------------------------------------------------------------------------
# full@X: the full-data frontier
# ---------------------------------------------------------------------------------------------


def _full_arm(fraction: float) -> Callable[[ArmContext], dict]:
    def full(ctx: ArmContext) -> dict:
        epochs = frontier_epochs(fraction, ctx.epochs)
        sched = ctx.step_schedule(epochs * len(ctx.source))
        trained = train_plain(ctx, ctx.source, epochs, sched)
        return {"samples_kept": trained, "epochs": epochs}

    full.__doc__ = f"Every sample, {fraction:g} of the task's epochs (rounded up), lr decayed to that end."
    return full


register("full@0.4", _full_arm(0.4), default=True, description="all data, 0.4 of the epochs", frontier=0.4)
register("full@0.6", _full_arm(0.6), default=True, description="all data, 0.6 of the epochs", frontier=0.6)
register("full@0.8", _full_arm(0.8), default=True, description="all data, 0.8 of the epochs", frontier=0.8)
register("full", _full_arm(1.0), default=True, description="all data, all epochs (full@1.0)", frontier=1.0)


# ---------------------------------------------------------------------------------------------
# the sifting loss: the sifting arms', and that of the planner of the uniform arm
# ---------------------------------------------------------------------------------------------


class PerSampleCrossEntropy(Loss):
    """The sifting loss: the training loss, one value per sample."""

    def loss(self, model: torch.nn.Module, transformed_batch: Any, original_batch: Any = None) -> torch.Tensor:
        x, y, _ = original_batch
        return F.cross_entropy(model(x), y, reduction="none")


# ---------------------------------------------------------------------------------------------
# uniform: a random subset of the sifting arms' kept share, no scoring
# ---------------------------------------------------------------------------------------------


class UniformSubsetLoader:
    """Keeps a uniform random ``k = round(n / (1 + beta))`` rows of every source batch (after
    ``sift_delay`` source batches passed through whole) and yields full batches of B; kept
    rows left at the end of an epoch are carried into the next, as the sifting loader does.
    No scoring forward: the cheapest way to train on the same share of the data.

    Per source batch it keeps what ``SiftingDataloader(selection_mode="fixed")`` keeps (the
    config's ``fixed_keep_count``), with the same delay and the same carry, so it emits the
    same number of batches per epoch: its plan is that loader's, from the library's planner
    (``planned_steps``)."""

    def __init__(self, source: DataLoader, beta: float, sift_delay: int, seed: int):
        if source.batch_size is None:
            raise ValueError("UniformSubsetLoader batches as its source does: a DataLoader with a batch_size")
        self.source = source
        self.b: int = source.batch_size
        self.rule = RelativeProbabilisticSiftConfig(
            beta_value=beta,
            loss_history_length=1,
            loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=sift_delay)),
            selection_mode="fixed",
            seed=seed,
        )
        self.sift_delay = sift_delay
        self.g = torch.Generator().manual_seed(seed + 12345)
        self.delay_progress = 0
        self.pending: list[tuple] = []
        self.n_pending = 0
        self.seen = 0
        self.kept = 0

    def keep_count(self, n: int) -> int:
        return self.rule.fixed_keep_count(n)

    def planned_steps(self, epochs: int) -> int:
        """Exact: the batches the first ``epochs`` epochs emit (planned before the first): the
        plan of a fixed-mode ``SiftingDataloader`` with this loader's rule over the same
        source, which is only planned, never iterated (its model, a module without
        parameters, keeps it on the CPU whatever the run's device)."""
        if self.seen:
            raise RuntimeError("UniformSubsetLoader plans from its first epoch: call planned_steps() before iterating")
        twin = SiftingDataloader(
            sift_config=self.rule,
            orig_dataloader=self.source,
            loss_impl=PerSampleCrossEntropy(),
            model=torch.nn.Module(),
        )
        return planned_steps(twin, epochs)

    def __iter__(self) -> Iterator[list]:
        for batch in self.source:
            n = batch[0].shape[0]
            self.seen += n
            if self.delay_progress < self.sift_delay:
                self.delay_progress += 1
                self.kept += n
                yield batch
                continue
            k = self.keep_count(n)
            rows = torch.sort(torch.randperm(n, generator=self.g)[:k]).values
            self.pending.append(tuple(t[rows] for t in batch))
            self.n_pending += k
            self.kept += k
            while self.n_pending >= self.b:
                cat = [torch.cat(parts) for parts in zip(*self.pending, strict=True)]
                out = [t[: self.b] for t in cat]
                rest = tuple(t[self.b :] for t in cat)
                self.n_pending -= self.b
                self.pending = [rest] if self.n_pending else []
                yield out


@register("uniform", default=True, description="a uniform random round(B / (1 + beta)) of every source batch")
def uniform(ctx: ArmContext) -> dict:
    loader = UniformSubsetLoader(ctx.source, ctx.beta, ctx.task.sift_delay, ctx.seed)
    sched = ctx.step_schedule(loader.planned_steps(ctx.epochs))
    train_plain(ctx, loader, ctx.epochs, sched, seen_of=lambda: loader.seen)
    return {"samples_kept": loader.kept}


# ---------------------------------------------------------------------------------------------
# sift-probabilistic, sift-fixed: neuron_sift's SiftingDataloader (the smart_sifting mode)
# ---------------------------------------------------------------------------------------------


def _sift_arm(mode: str) -> Callable[[ArmContext], dict]:
    def sift(ctx: ArmContext) -> dict:
        config = RelativeProbabilisticSiftConfig(
            beta_value=ctx.beta,
            loss_history_length=ctx.task.history,
            loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=ctx.task.sift_delay)),
            selection_mode=mode,
            seed=ctx.seed,
        )
        loader = SiftingDataloader(
            sift_config=config, orig_dataloader=ctx.source, loss_impl=PerSampleCrossEntropy(), model=ctx.model
        )
        sched = ctx.step_schedule(planned_steps(loader, ctx.epochs))
        train_plain(ctx, loader, ctx.epochs, sched, seen_of=lambda: loader.counts.num_orig_samples_seen)
        m = loader.metrics()
        seen = ctx.epochs * len(ctx.dataset)
        if m["num_orig_samples_seen"] != seen:
            raise RuntimeError(f"sift-{mode}: the loader saw {m['num_orig_samples_seen']} samples, expected {seen}")
        return {
            "samples_kept": m["num_orig_samples_kept"],
            "scoring_forward_samples": m["device_num_scored"],
            "machinery_s": round(m["machinery_seconds"], 4),
            "scoring_forward_s": round(m["timings"].get("calculate_relevance_values", {}).get("seconds", 0.0), 4),
            "samples_pending_at_end": m["num_samples_pending"],
            "source_batches_delayed": m["num_source_batches_delayed"],
        }

    sift.__doc__ = f"SiftingDataloader, selection_mode={mode!r}."
    return sift


register(
    "sift-probabilistic",
    _sift_arm("probabilistic"),
    default=True,
    description="SiftingDataloader, keep with probability percentile ** beta",
)
register(
    "sift-fixed",
    _sift_arm("fixed"),
    default=True,
    description="SiftingDataloader(selection_mode='fixed'): round(B / (1 + beta)) per source batch",
)

from infobatch import infobatch_arm  # noqa: E402

register(
    "infobatch",
    infobatch_arm,
    default=True,
    description="a reimplementation of InfoBatch's published rule (Qin et al., ICLR 2024)",
)
