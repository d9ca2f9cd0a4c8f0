"""The counts a run's settings plan, checked once when the loader is built.

Why at construction: a source and budget whose epochs yield no batch on some rank would run
zero steps without an error, and a budget rounded to whole batches can train a share far
from the one asked; both are known from the planner's counts before the first epoch.
"""

import logging

from neuron_sift.epoch.planning.plan import EpochPlan
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.shared.logs import EPOCH_LOGGER

logger = logging.getLogger(EPOCH_LOGGER)

# A budget whose whole count trains a share further than this fraction of ``kept_share``
# from it (0.01 of 50 samples trains 1, a share of 0.02) is reported when the loader is built.
BUDGET_TOLERANCE = 0.2


def check_planned_counts(planner: EpochPlanner) -> None:
    """Refuse a source and budget whose epochs would yield no batch on a rank; log a warning
    (once, at construction) when the budget's whole count trains a share far from
    ``kept_share``.

    Why: with ``drop_last`` a rank whose share of an epoch is shorter than one batch
    trains nothing that epoch, and the loop runs zero steps without an error. The shares
    are known before the first epoch: a full epoch's ``M // W`` samples per rank (``M`` the
    samples the sampler yields, ``W`` the ranks), and a budgeted sifted epoch's
    ``budget_count() // W``. Without a budget a sifted epoch keeps at least one whole batch
    per rank whenever a full epoch has one (``EpochPlanner.free_count``).
    """
    m, w, b = planner.m, planner.world_size, planner.batch_size
    what = "the dataset has" if planner.support is None else "the sampler yields"
    if planner.rank_batches(planner.expected_count(0)) == 0:  # epoch 0 trains every sample
        shares = f"{what} {m} samples" if w == 1 else f"{what} {m} samples, {m // w} for each of the {w} ranks"
        raise ValueError(_no_batch(shares, m // w, b))
    if not planner.config.has_budget or not planner.sifts():
        return
    # Without num_epochs every epoch after the warm-up is sifted: the first one is enough to read.
    horizon = planner.num_epochs if planner.num_epochs is not None else max(planner.config.warmup_epochs, 1) + 1
    sifted = [e for e in range(horizon) if planner.kind(e) == "sift"]
    epoch = min(sifted, key=planner.budget_count)  # the epoch keeping fewest
    share, k = planner.budget_share(epoch), planner.budget_count(epoch)
    setting = _budget_setting(planner)
    where = "per sifted epoch" if planner.config.kept_share is not None else f"in sifted epoch {epoch}"
    trained = planner.rank_batches(k) * b * w if planner.drop_last else k
    if trained == 0:
        per_rank = "" if w == 1 else f", {k // w} for each of the {w} ranks"
        raise ValueError(
            f"EpochSiftingDataloader: {setting} keeps {k} of the {m} samples {where}{per_rank}, "
            f"fewer than one batch of {b}, and the DataLoader has drop_last=True, which leaves a short batch "
            f"out: {'every' if planner.config.kept_share is not None else 'that'} sifted epoch would train nothing. Use {'kept_share' if planner.config.kept_share is not None else 'a budget'} "
            f">= {b * w / m:.4g} (one whole batch per rank), drop_last=False, or a smaller batch size"
        )
    if abs(trained / m - share) > BUDGET_TOLERANCE * share:
        cut = f"; drop_last=True trains only each rank's whole batches of {b}: {trained}" if trained != k else ""
        logger.warning(
            "EpochSiftingDataloader: %s of %d samples trains %d %s, a share of %.4g: the budget "
            "keeps %d (%.4g * %d rounded half up, then down to a multiple of the %d rank(s), at least one each)%s",
            setting,
            m,
            trained,
            where,
            trained / m,
            k,
            share,
            m,
            w,
            cut,
        )


def _budget_setting(planner: EpochPlanner) -> str:
    c = planner.config
    return f"kept_share={c.kept_share:g}" if c.kept_share is not None else f"max_pruned_share={c.max_pruned_share:g}"


def _no_batch(shares: str, per_rank: int, batch_size: int) -> str:
    return (
        f"EpochSiftingDataloader: {shares}, fewer than one batch of {batch_size}, and the DataLoader has "
        "drop_last=True, which leaves a short batch out: every epoch would yield no batch and train nothing. "
        f"Use drop_last=False (the short batch is trained), a batch size of at most {max(per_rank, 1)}, or more "
        "samples"
    )


def warn_short_epoch(planner: EpochPlanner, plan: EpochPlan, trained: int) -> None:
    """Warn when a budgeted sifted epoch trains less than ``1 - BUDGET_TOLERANCE`` of its
    budget (``kept_share * M``), whatever the cause: the noise guard's exclusions, too few
    samples the policy keeps with any probability, or ``drop_last`` cutting each rank's short
    batch. ``trained``: the epoch's samples trained over all ranks. The same on every rank.

    Why at run time: the construction-time check sees only the budget's rounding; what the
    guard leaves out is known only when the epoch is planned, and a run that trains far less
    than asked should not go on without a word."""
    if not planner.config.has_budget or plan.kind != "sift":
        return
    share = planner.budget_share(plan.epoch)
    budget = share * planner.m
    if trained >= (1.0 - BUDGET_TOLERANCE) * budget:
        return
    causes = []
    if plan.excluded:
        causes.append(f"the noise guard left out {plan.excluded} samples")
    if planner.drop_last and trained < plan.kept * (planner.world_size if planner.plans_own_share else 1):
        causes.append("drop_last=True cut each rank's short last batch")
    logger.warning(
        "EpochSiftingDataloader: epoch %d (0-based) trains %d of %d samples, a share of %.4g, more than %d%% below "
        "its budget, %.4g (%s: %d samples)%s",
        plan.epoch,
        trained,
        planner.m,
        trained / planner.m,
        round(100 * BUDGET_TOLERANCE),
        share,
        _budget_setting(planner),
        round(budget),
        f": {'; '.join(causes)}" if causes else ": too few samples have a keep probability above 0",
    )
