"""What decides when a per-batch loader's ranks meet and how many batches they emit, checked
to be the same on every rank at construction.

Why: under data parallelism every rank must emit the same number of batches per epoch, or
the rank with more waits forever in DDP's gradient all-reduce; the ranks get there by
agreeing at the same points (``agreement.py``: every ``1 + beta`` scored source batches and at
each epoch's end, in probabilistic mode), by keeping the same count of every batch (fixed
mode), and with ``global_loss_history`` by one all-gather per scored source batch. A rank
built with another selection mode, ``beta_value``, delay, history setting, batch size or
number of source samples per epoch meets its peers at other points: a wait until the
process group's timeout, or a collective mismatch. The history length and ``max_pending``
do not move those points, but ranks that differ in them sift by different rules without a
word; they must agree too.

The seed need not: each rank mixes it with its rank (``engine/sifter.py``), so ranks draw
independently whatever seeds they are given.
"""

from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.same_settings import Setting, check_same_settings
from neuron_sift.shared.sources import batch_settings, sampler_info
from neuron_sift.sift_config.sift_configs import CRITERIA, SELECTION_MODES, RelativeProbabilisticSiftConfig

ADVICE = (
    "Build every rank's SiftingDataloader with the same RelativeProbabilisticSiftConfig (the seed may differ), "
    "max_pending and source loader batching: the same batch size and the same number of samples per epoch on "
    "every rank (a DistributedSampler gives each rank an equal share)."
)


def emission_settings(
    config: RelativeProbabilisticSiftConfig, planning_loader: object, batch_size: int | None, max_pending: int | None
) -> list[Setting]:
    """Every setting the ranks' meeting points and emitted counts depend on, by the name the
    user gives it. ``planning_loader``: the DataLoader inside the user's wrappers; its samples
    per epoch are None when it does not say (not a DataLoader, or an unsized sampler)."""
    base = config.base_config
    info = sampler_info(planning_loader)
    return [
        Setting("selection_mode", config.selection_mode, SELECTION_MODES),
        Setting("beta_value", config.beta_value),
        Setting("criterion", config.criterion, CRITERIA),
        Setting("loss_history_length", config.loss_history_length),
        Setting("global_loss_history", config.global_loss_history),
        Setting("sift_delay", base.sift_delay),
        Setting("repeat_delay_per_epoch", base.repeat_delay_per_epoch),
        Setting("batch_size", batch_size),
        Setting("drop_last", batch_settings(planning_loader).drop_last),
        Setting("samples per epoch (the source loader's sampler length)", None if info is None else info[1]),
        Setting("max_pending", max_pending),
    ]


def check_same_on_every_rank(
    config: RelativeProbabilisticSiftConfig,
    planning_loader: object,
    batch_size: int | None,
    max_pending: int | None,
    ranks: RankGroup,
) -> None:
    """Refuse, on every rank, ``emission_settings`` that differ between ranks: one all-gather
    of ``16 * len(settings)`` bytes per rank under data parallelism, on every rank whatever
    its settings, at construction."""
    settings = emission_settings(config, planning_loader, batch_size, max_pending)
    check_same_settings(settings, ranks, "SiftingDataloader", ADVICE)
