"""Arms of the epoch-level sifting mode (``EpochSiftingDataloader``): a plug-in of the
suite's registry (``register_arms``, listed in ``benchmarks/arms/__init__.py``).

Every arm trains exactly as a user would: the task's ``DataLoader`` over the dataset (batch
size as the task's, shuffled by a generator seeded with the run seed) handed to
``EpochSiftingDataloader``, the per-sample cross-entropy of the training forward passed to
``weighted_loss``, nothing else. No scoring forward. The learning-rate schedule decays to 0
at the arm's own end: over ``loader.planned_steps()`` (exact) for budgeted arms, epoch by
epoch (each epoch's exact length is known when ``iter()`` plans it) for the others, as the
``infobatch`` arm does.

The arms (``epoch`` is the default one, the best of the sweep on the main job; the others
are the sweep of ``README.md``, "Epoch-level sifting"):

* ``epoch``: percentile, the sweep's best setting (``core.planned.EPOCH_ARM_SETTING``);
* ``epoch-pct-b{beta}-f{floor}``: percentile policy, beta and floor;
* ``epoch-bm-r{ratio}``: below_mean (InfoBatch's rule), prune ratio;
* ``epoch-pct-k{share}``, ``epoch-bm-k{share}``: the budget form, kept share per epoch;
* ``epoch-pct-w{warm}-a{anneal}``: warm-up epochs and annealing fraction around percentile;
* ``epoch-nostart``, ``epoch-start{t}``: the default without the start rule (0.8.0's), with
  another threshold; ``epoch-auto{s}``: the automatic budget (``max_pruned_share``);
  ``epoch-ema{s}``: smoothed scores (``score_smoothing``).
"""

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader

from benchmarks.core.context import ArmContext
from benchmarks.core.loops import train_weighted_epoch
from benchmarks.core.planned import EPOCH_ARM_SETTING
from neuron_sift import EpochSiftConfig, EpochSiftingDataloader


def train_epoch_sifted(ctx: ArmContext, config: dict) -> dict:
    source = DataLoader(
        ctx.dataset, batch_size=ctx.task.batch_size, shuffle=True, generator=torch.Generator().manual_seed(ctx.seed)
    )
    loader = EpochSiftingDataloader(EpochSiftConfig(seed=ctx.seed, **config), source, num_epochs=ctx.epochs)
    budget = loader.length_is_exact  # the run's steps known now; else each epoch's, when it is planned
    sched = ctx.step_schedule(loader.planned_steps()) if budget else ctx.epoch_schedule(ctx.epochs)

    def weighted(ids: torch.Tensor, per_sample: torch.Tensor) -> torch.Tensor:
        return loader.weighted_loss(per_sample)  # pairs the losses with the batch's ids itself

    kept_per_epoch = []
    for epoch in range(ctx.epochs):
        plan = loader.start_epoch()  # plans the epoch: its length is known now
        batches = iter(loader)
        k = plan.kept
        kept_per_epoch.append(k)
        if not budget:
            sched.begin_epoch(len(loader))
        train_weighted_epoch(ctx, batches, sched, epoch, k, weighted)
    m = loader.metrics()
    return {
        "samples_kept": sum(kept_per_epoch),
        "scoring_forward_samples": 0,
        "kept_per_epoch": kept_per_epoch,
        "epoch_config": {k: v for k, v in config.items()},
        "planning_s": round(m["planning_seconds"], 4),
        "weighted_loss_s": round(m["weighted_loss_seconds"], 4),
        "excluded_by_guard": [h["excluded"] for h in m["epochs"]],
        "num_nonfinite_losses": m["num_nonfinite_losses"],
    }


def epoch_arm(**config) -> Callable[[ArmContext], dict]:
    def arm(ctx: ArmContext) -> dict:
        return train_epoch_sifted(ctx, config)

    arm.__doc__ = f"EpochSiftingDataloader with {config}"
    return arm


def register_arms(register: Callable[..., Callable]) -> None:
    """``epoch`` (a default arm) and the sweep around it."""

    def add(name: str, default: bool = False, **config) -> None:
        register(name, epoch_arm(**config), default=default, description=f"epoch-level sifting {config}")

    add("epoch", default=True, **EPOCH_ARM_SETTING)
    for beta, floor in [(0.5, 0.05), (1.0, 0.05), (2.0, 0.05), (1.0, 0.2), (3.0, 0.1)]:
        add(f"epoch-pct-b{beta:g}-f{floor:g}", policy="percentile", beta_value=beta, min_keep_probability=floor)
    for ratio in (0.5, 0.7, 0.9):
        add(f"epoch-bm-r{ratio:g}", policy="below_mean", prune_ratio=ratio)
    for share in (0.3, 0.4, 0.5, 0.6):
        add(f"epoch-pct-k{share:g}", policy="percentile", kept_share=share)
    for share in (0.4, 0.5, 0.6):
        add(f"epoch-bm-k{share:g}", policy="below_mean", kept_share=share)
    for share, anneal in [(0.4, 0.25), (0.5, 0.25)]:
        add(f"epoch-pct-k{share:g}-a{anneal:g}", policy="percentile", kept_share=share, anneal_fraction=anneal)
    for warm, anneal in [(0, 0.125), (2, 0.125), (1, 0.0), (1, 0.25)]:
        add(f"epoch-pct-w{warm}-a{anneal:g}", policy="percentile", warmup_epochs=warm, anneal_fraction=anneal)
    # the start rule, the automatic budget and smoothed scores against the default's
    add("epoch-nostart", **{**EPOCH_ARM_SETTING, "start_rank_correlation": None})
    for threshold in (0.3, 0.7):
        add(f"epoch-start{threshold:g}", **{**EPOCH_ARM_SETTING, "start_rank_correlation": threshold})
    add("epoch-auto0.6", **{**EPOCH_ARM_SETTING, "kept_share": None, "max_pruned_share": 0.6})
    add("epoch-ema0.5", **{**EPOCH_ARM_SETTING, "score_smoothing": 0.5})
    for epochs_high, q in [(2, 0.8), (2, 0.9), (3, 0.8)]:
        add(
            f"epoch-guard-g{epochs_high}-q{q:g}",
            policy="percentile",
            noise_guard_epochs=epochs_high,
            noise_guard_quantile=q,
        )
