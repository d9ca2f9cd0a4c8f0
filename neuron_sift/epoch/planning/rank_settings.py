"""What decides an epoch loader's plans, checked to be the same on every rank at construction.

Why: every rank plans the same global epoch from the same merged scores (the replicated
table) or its own share of it from the same merged summary (the sharded table), and runs the
same collectives at the same epochs. A rank built with another dataset length, budget,
batch size, seed, number of epochs, policy or sampler would plan another epoch: a sharded run
then waits in the first sifted epoch's summary all-gather until the process group's timeout,
a replicated one aborts on a collective mismatch or, where the collectives still line up,
each rank trains its own plan without a word (samples twice, others never). The loader
gathers these settings once (``shared/same_settings.py``) and every rank refuses the same
differences before any plan is made.
"""

import dataclasses
import hashlib

import torch

from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.user_data.sampling import support_checksum
from neuron_sift.shared.logs import seed63
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.same_settings import Setting, check_same_settings
from neuron_sift.sift_config.epoch_config import EPOCH_POLICIES, SCORE_TABLES, EpochSiftConfig

_CHOICES = {"policy": EPOCH_POLICIES, "score_table": SCORE_TABLES}

ADVICE = (
    "Build every rank's EpochSiftingDataloader with the same EpochSiftConfig, num_epochs and source DataLoader "
    "(the same dataset, batch_size, drop_last and sampler); it shards each epoch's plan over the ranks itself."
)
SEED_HINT = (
    "The plans' seed is EpochSiftConfig.seed, else the source DataLoader's generator's initial seed, else "
    "torch.initial_seed() (not the same on ranks seeded one by one, as by torch.manual_seed(seed + rank)): "
    "give the same EpochSiftConfig(seed=...) on every rank."
)
SAMPLER_HINT = (
    "The source loader's sampler yields a different set of samples (or order) on each rank, e.g. a per-rank "
    "shard; EpochSiftingDataloader shards each epoch's plan over the ranks itself: give every rank the same "
    "sampler over all the samples to train (a SubsetRandomSampler with the same indices, or a Subset with "
    "shuffle=True)."
)


def plan_seed(config: EpochSiftConfig, generator_seed: int | None) -> int:
    """The seed of every plan: the config's, else the source DataLoader's generator's, else
    ``torch.initial_seed()``, as a non-negative int64."""
    if config.seed is not None:
        return seed63(config.seed)
    return seed63(generator_seed if generator_seed is not None else torch.initial_seed())


def settings_to_agree(run: PlanSettings) -> list[Setting]:
    """Every setting of ``run`` a plan depends on, by the name the user gives it: the
    dataset's length, the batching, the seed used, ``num_epochs``, each field of the config
    (its ``seed`` is the seed used), the sampler's samples and order, and the reference
    table's identity (all but the rank layout, which is each rank's own)."""
    config, support = run.config, run.support
    fields = [
        Setting(f.name, getattr(config, f.name), _CHOICES.get(f.name, ()))
        for f in dataclasses.fields(config)
        if f.name != "seed"
    ]
    crc = support_checksum(support)
    return [
        Setting("dataset length", run.n),
        Setting("batch_size", run.batch_size),
        Setting("drop_last", run.drop_last),
        Setting("seed", run.seed, hint=SEED_HINT),
        Setting("num_epochs", run.num_epochs),
        *fields,
        Setting("sampler's samples (CRC-32 of their ids; None: all)", crc, hint=SAMPLER_HINT),
        Setting(
            "sampler's sample count (None: all)",
            None if support is None else int(support.shape[0]),
            hint=SAMPLER_HINT,
        ),
        Setting("sampler's order (True: dataset order)", run.ordered, hint=SAMPLER_HINT),
        Setting("reference table (a digest of its identity; None: none)", _digest(run.reference)),
    ]


def _digest(text: str | None) -> int | None:
    """``text`` as a signed int64 (its SHA-256's first 8 bytes): comparable across ranks."""
    if text is None:
        return None
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


def agreed_settings(run: PlanSettings, ranks: RankGroup) -> PlanSettings:
    """``run`` (the run's settings, before any rank takes its place in them) as this rank's,
    once checked to be the same on every rank: refused on every rank where they differ (one
    all-gather of ``16 * len(settings_to_agree(run))`` bytes per rank under data parallelism,
    on every rank whatever its settings), before any rank could refuse its own place alone."""
    check_same_settings(settings_to_agree(run), ranks, "EpochSiftingDataloader", ADVICE)
    return run.as_rank(ranks.world_size, ranks.rank)
