"""The single-pass language-model task's arms (``lm_suite.py``): the full-data frontier, the
library's per-batch mode (``SiftingDataloader``, both selection modes) at the default beta
and at beta 2, and uniform random subsets at the same kept shares.

Every arm takes the same number of optimizer steps (a frontier run ``lm-full@X`` takes X of
them, its schedule ended at its own end); an arm that keeps a share of each source batch
reads further into the stream for them. Why both betas: beta 1 keeps about half of what it
scores, beta 2 about a third (``RelativeProbabilisticSiftConfig.expected_kept_share``: 1 / (1
+ beta)); a sifting arm that does not beat ``uniform`` at its kept share got nothing from
its losses. Like the sifting loader, ``uniform`` passes the first ``sift_delay`` source
batches through whole and carries leftover kept rows into the next batch.

The ``SCORERS`` arms (by name only) rank by cheaper scorers and other criteria, each the
hard top-k half of every source batch: the learner's loss (``lm-sift-topk``), its excess
over a reference model's loss (``lm-sift-excess``), a small scoring model's loss with and
without the reference (``lm-sift-scorer``, ``lm-sift-scorer-excess``), and the static
reference filter (``lm-reference-filter``: the lowest reference losses, no online forward).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from benchmarks.core.lm_context import LMContext, PartTimes
from benchmarks.core.lm_reference import scorer_kwargs
from benchmarks.tasks.lm_model import sequence_losses
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.loss.abstract_sift_loss_module import Loss
from neuron_sift.sift_config.sift_configs import LossConfig, RelativeProbabilisticSiftConfig, SiftingBaseConfig

FRONTIER = (0.4, 0.6, 0.8)
BETAS = (1.0, 2.0)


@dataclass(frozen=True)
class Scorer:
    """A cheaper scorer or another criterion for a sifting arm (``core/lm_reference.py``):
    ``criterion`` (the config's), whether it reads a reference table, whether it scores
    with a small scoring model trained on the yielded batches."""

    name: str
    criterion: str = "loss"
    reference: bool = False
    scoring_model: bool = False

    def build(self, ctx: LMContext, config: RelativeProbabilisticSiftConfig) -> dict:
        exact = config.keeps_exact_count
        b = ctx.config.batch_size
        share = config.fixed_keep_count(b) / b if exact else config.expected_kept_share()
        return scorer_kwargs(ctx, share, exact, self.reference, self.scoring_model)


SCORERS = {  # arm name -> (scorer, what it ranks by); all hard top-k at beta 1 (keep 1/2)
    "lm-sift-topk": (Scorer("model"), "the learner's loss"),
    "lm-sift-excess": (Scorer("model", "excess", reference=True), "the learner's loss minus the reference loss"),
    "lm-sift-scorer": (Scorer("small", scoring_model=True), "a small scoring model's loss"),
    "lm-sift-scorer-excess": (
        Scorer("small", "excess", reference=True, scoring_model=True),
        "a small scoring model's loss minus the reference loss",
    ),
    "lm-reference-filter": (Scorer("reference", "reference", reference=True), "the reference loss alone (lowest)"),
}


class SequenceLoss(Loss):
    """The sifting loss: each window's mean next-byte cross-entropy (the training loss),
    timed as the run's ``scoring`` part on both clocks."""

    def __init__(self, parts: PartTimes, sync: Callable[[], None] | None = None):
        self.parts = parts
        self.sync = sync

    def loss(self, model: torch.nn.Module, transformed_batch: Any, original_batch: Any = None) -> torch.Tensor:
        if torch.is_grad_enabled():  # the scoring model's own training step, timed whole by the arm
            return sequence_losses(model, original_batch[0].to(next(model.parameters()).device))
        with self.parts.timed("scoring"):
            seq = original_batch[0].to(next(model.parameters()).device)
            losses = sequence_losses(model, seq)
            if self.sync:  # torch-xla: run the scoring graph inside its own timing, not the selection's
                self.sync()
            return losses


class TimedSource:
    """The seed's stream as the sifting loader reads it, each fetch timed (``source``): the
    loader's time less its scoring and its reading is its machinery. ``_loader`` is how the
    loader finds the DataLoader inside a wrapper (its batch size, its length)."""

    def __init__(self, loader: DataLoader, watch: PartTimes):
        self._loader = loader
        self.watch = watch

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._loader)
        while True:
            with self.watch.timed("source"):
                batch = next(it, None)
            if batch is None:
                return
            yield batch


def sift_config(
    ctx: LMContext, beta: float, mode: str, scoring_precision: str = "model", criterion: str = "loss"
) -> RelativeProbabilisticSiftConfig:
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=ctx.config.history,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=ctx.config.sift_delay)),
        selection_mode=mode,
        seed=ctx.seed,
        scoring_precision=scoring_precision,
        criterion=criterion,
    )


def full_arm(fraction: float) -> Callable[[LMContext], dict]:
    def full(ctx: LMContext) -> dict:
        ctx.schedule(fraction)
        seen = 0
        for seq, _ in ctx.source:
            seen += int(seq.shape[0])
            ctx.train_step(seq, seen)
            if ctx.done:
                break
        return {"budget_fraction": fraction}

    full.__doc__ = f"Every window of the stream, {fraction:g} of the step budget, lr decayed to that end."
    return full


def uniform_batches(ctx: LMContext, beta: float) -> Iterator[tuple[torch.Tensor, int]]:
    """Batches of B windows, each source batch (after ``sift_delay`` whole ones) reduced to a
    uniform random ``fixed_keep_count`` of its rows; with the source windows read so far."""
    keep = sift_config(ctx, beta, "fixed").fixed_keep_count(ctx.config.batch_size)
    g = torch.Generator().manual_seed(ctx.seed + 12345)
    b = ctx.config.batch_size
    pending: list[torch.Tensor] = []
    n_pending = seen = 0
    for i, (seq, _) in enumerate(ctx.source):
        seen += int(seq.shape[0])
        if i < ctx.config.sift_delay:
            yield seq, seen
            continue
        with ctx.parts.timed("machinery"):
            rows = torch.randperm(seq.shape[0], generator=g)[:keep].sort().values
            pending.append(seq[rows])
            n_pending += rows.numel()
            out = None
            if n_pending >= b:
                cat = torch.cat(pending)
                out, rest = cat[:b], cat[b:]
                pending, n_pending = ([rest] if rest.shape[0] else []), rest.shape[0]
        if out is not None:
            yield out, seen


def uniform_arm(beta: float) -> Callable[[LMContext], dict]:
    def uniform(ctx: LMContext) -> dict:
        ctx.schedule()
        for seq, seen in uniform_batches(ctx, beta):
            ctx.train_step(seq, seen)
            if ctx.done:
                break
        return {"beta_value": beta}

    uniform.__doc__ = f"A uniform random 1/(1+{beta:g}) of every source batch, no scoring."
    return uniform


def sift_arm(
    mode: str, beta: float, scoring_precision: str = "model", scorer: Scorer | None = None
) -> Callable[[LMContext], dict]:
    def sift(ctx: LMContext) -> dict:
        ctx.schedule()
        config = sift_config(ctx, beta, mode, scoring_precision, "loss" if scorer is None else scorer.criterion)
        extra: dict = {}
        if scorer is not None:  # the reference model and its table, the scoring model: scoring costs
            with ctx.parts.timed("scoring"):
                extra = scorer.build(ctx, config)
        before = {clock: getattr(ctx.parts, clock)["scoring"] for clock in ("wall", "cpu")}
        watch = PartTimes(ctx.parts.wait, parts=("loader", "source"))
        with watch.timed("loader"):  # its setup and planning are the loader's own work too
            loader = SiftingDataloader(
                sift_config=config,
                orig_dataloader=TimedSource(ctx.source, watch),
                loss_impl=SequenceLoss(ctx.parts, ctx.sync),
                model=ctx.model,
                **extra,
            )
            batches = iter(loader)
            if "scoring_optimizer" in extra:  # the scoring model's training is scoring too
                loader.scorer.learn = ctx.parts.timing("scoring", loader.scorer.learn)  # type: ignore[method-assign]
        while not ctx.done:
            with watch.timed("loader"):
                batch = next(batches, None)
            if batch is None:
                break  # the stream ran out: run_lm_arm reports the steps missing
            ctx.train_step(batch[0], loader.counts.num_orig_samples_seen)
        with watch.timed("loader"):
            m = loader.metrics()
        # The loader's time less its reading and the scoring timed inside it (its scoring
        # forwards, the scoring model's training) is the machinery, on each clock.
        mach = {
            clock: max(
                getattr(watch, clock)["loader"]
                - getattr(watch, clock)["source"]
                - (getattr(ctx.parts, clock)["scoring"] - before[clock]),
                0.0,
            )
            for clock in ("wall", "cpu")
        }
        ctx.parts.add("machinery", mach["wall"], mach["cpu"])
        return {
            "beta_value": beta,
            "selection_mode": mode,
            "criterion": config.criterion,
            "scorer": "model" if scorer is None else scorer.name,
            "scoring_precision": scoring_precision,
            "scoring_forward_samples": 0 if config.criterion == "reference" else int(m["device_num_scored"]),
            "loader_machinery_host_s": round(m["machinery_seconds"], 4),
            "source_batches_delayed": m["num_source_batches_delayed"],
        }

    sift.__doc__ = (
        f"SiftingDataloader, selection_mode={mode!r}, beta {beta:g}, scoring precision {scoring_precision!r}."
    )
    return sift


def register_arms(register: Callable[..., Callable]) -> None:
    """The LM task's frontier, ``lm-uniform``, ``lm-sift-probabilistic``, ``lm-sift-fixed``
    (beta 1) and their beta-2 twins (``-b2``), all default arms of that task; by name only,
    ``lm-sift-probabilistic-bf16`` (the cheaper scoring forward) and the ``SCORERS`` arms."""
    for x in FRONTIER:
        register(
            f"lm-full@{x:g}",
            full_arm(x),
            default=True,
            single_pass=True,
            description=f"all windows, {x:g} of the steps",
            frontier=x,
        )
    register(
        "lm-full", full_arm(1.0), default=True, single_pass=True, description="all windows, all steps", frontier=1.0
    )
    for beta in BETAS:
        tail = "" if beta == 1.0 else f"-b{beta:g}"
        share = f"1/{1 + beta:g}"
        register(
            f"lm-uniform{tail}",
            uniform_arm(beta),
            default=True,
            single_pass=True,
            description=f"a uniform random {share} of every source batch",
        )
        for mode in ("probabilistic", "fixed"):
            register(
                f"lm-sift-{mode}{tail}",
                sift_arm(mode, beta),
                default=True,
                single_pass=True,
                description=f"SiftingDataloader({mode}), beta {beta:g}: keeps about {share}",
            )
    for name, (scorer, ranks) in SCORERS.items():  # issue 41's scorers and criteria, by name only
        register(
            name,
            sift_arm("topk", 1.0, scorer=scorer),
            single_pass=True,
            description=f"SiftingDataloader(topk), beta 1: keeps the 1/2 of each source batch ranked highest by {ranks}",
        )
    register(  # the cheaper scoring forward (opt-in): bfloat16 autocast where the device has it
        "lm-sift-probabilistic-bf16",
        sift_arm("probabilistic", 1.0, "bfloat16"),
        single_pass=True,
        description="SiftingDataloader(probabilistic), beta 1, scoring under bfloat16 autocast",
    )
