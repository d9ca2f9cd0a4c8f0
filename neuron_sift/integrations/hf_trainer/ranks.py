"""The data-parallel world of a Hugging Face ``Trainer``: what the sifting loaders coordinate over.

Why: left to themselves, both loaders follow ``torch.distributed`` (``distributed=None``),
but a process group is not data parallelism. Under ``torchrun`` on a machine where
accelerate finds no accelerator and ``use_cpu`` is not set, accelerate initialises a gloo
group and then trains with ``DistributedType.NO`` (``ParallelMode.NOT_PARALLEL``): no DDP
wrapper, no gradient all-reduce, every process training all the data on its own. An epoch
plan sharded over those processes, or per-batch draws seeded per rank, would make each
process train different samples with nothing to bring the weights back together. So the
integration asks the Trainer which processes share its data and average gradients, and
passes the answer to the loader as ``distributed=``:

- the Trainer trains in one process (``not_parallel``, ``not_distributed``: one process
  driving ``nn.DataParallel``, or a one-device run): ``distributed=False``, whatever
  ``torch.distributed`` says. Each process then sifts exactly as a one-process run would,
  the same run as the Trainer without sifting (a process group of several ranks is named
  in a log warning: the user may have meant data parallelism);
- the Trainer shards the data over ``W > 1`` processes: ``distributed=True``, and
  ``torch.distributed`` must have exactly those ``W`` ranks (the loaders' collectives run
  over it) and the Trainer's train loader must be sharded over ``W`` (with tensor or
  context parallelism, processes of one data-parallel rank share their batches, a layout
  the loaders do not coordinate). Otherwise a ``ValueError`` names both worlds.

The Trainer's world is read as ``trainer.accelerator.num_processes`` (what accelerate
shards the train loader by), falling back to ``args.world_size``; ``args.parallel_mode``
and accelerate's ``distributed_type`` only describe it in messages. All of these exist in
every transformers and accelerate the metadata admits (transformers 4.52.1 to 5.x).
"""

import logging
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.utils.data import IterableDataset

from neuron_sift.shared.sources import batch_settings, underlying_dataloader, unwrap

logger = logging.getLogger(
    "neuron_sift.integrations.trainer_ranks"
)  # its name before the room: users' logging settings hold


@dataclass(frozen=True)
class TrainerWorld:
    """How a Trainer trains: ``processes`` that split its training data and average their
    gradients (1: each process trains on its own), ``parallel_mode`` (the value of
    ``args.parallel_mode``: ``"not_parallel"``, ``"distributed"``, ``"tpu"``, ...) and
    accelerate's ``distributed_type`` name (``"NO"``, ``"MULTI_CPU"``, ...)."""

    processes: int
    parallel_mode: str
    distributed_type: str

    def describe(self) -> str:
        unit = "process" if self.processes == 1 else "processes"
        return (
            f"{self.processes} {unit}; args.parallel_mode={self.parallel_mode}, "
            f"accelerate distributed_type={self.distributed_type}"
        )


def _name(value: Any, attribute: str) -> str:
    """An enum member's value or name (transformers' and accelerate's enums), else ``str``."""
    if value is None:
        return "unknown"
    return str(getattr(value, attribute, value))


def read_trainer_world(trainer: Any) -> TrainerWorld:
    """The Trainer's data-parallel world (see the module docstring for what is read)."""
    args = trainer.args
    accelerator = getattr(trainer, "accelerator", None)
    processes = getattr(accelerator, "num_processes", None)
    if isinstance(processes, bool) or not isinstance(processes, int):
        processes = getattr(args, "world_size", 1)
    return TrainerWorld(
        processes=max(1, int(processes or 1)),
        parallel_mode=_name(getattr(args, "parallel_mode", None), "value"),
        distributed_type=_name(getattr(accelerator, "distributed_type", None), "name"),
    )


def torch_world_size() -> int:
    """Ranks of ``torch.distributed``'s default group (1 when it is not initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def loader_shards(prepared: Any) -> int | None:
    """Processes the Trainer's prepared train loader shards its batches over: accelerate's
    ``BatchSamplerShard`` says how many, any other batch sampler over a map-style dataset
    is not sharded (1); None when it cannot be told (batches dispatched by accelerate from
    one process: an iterable dataset, or ``dispatch_batches=True``)."""
    if any(type(node).__name__ == "DataLoaderDispatcher" for node in unwrap(prepared).objects()):
        return None
    inner = underlying_dataloader(prepared)
    if isinstance(getattr(inner, "dataset", None), IterableDataset):
        return None
    shards = getattr(batch_settings(inner).batch_sampler, "num_processes", None)
    if isinstance(shards, bool) or not isinstance(shards, int):
        return 1
    return shards


def sifting_distributed(world: TrainerWorld, torch_ranks: int, shards: int | None = None) -> bool:
    """The loader's ``distributed=`` for a Trainer training in ``world``, with
    ``torch.distributed`` at ``torch_ranks`` ranks and the train loader sharded over
    ``shards`` processes (None: unknown); ``ValueError`` when they cannot be reconciled."""
    if shards is not None and shards != world.processes:
        raise ValueError(
            f"the Trainer trains over {world.describe()}, but its train loader is sharded over {shards} "
            f"process(es): processes that share their batches (tensor, context or model parallelism) are not "
            f"supported by sifting, which coordinates one data-parallel rank per process. Train with data "
            f"parallelism only (DDP, FSDP, DeepSpeed) or in one process"
        )
    if world.processes == 1:
        return False
    if torch_ranks == world.processes:
        return True
    group = "is not initialised" if torch_ranks == 1 else f"has {torch_ranks} ranks"
    hint = (
        "On XLA, initialise the process group before building the TrainingArguments: "
        "torch.distributed.init_process_group('xla', init_method='xla://')"
        if world.parallel_mode == "tpu"
        else "Launch one process per data-parallel rank with torchrun or accelerate launch, and let "
        "accelerate (the TrainingArguments) initialise the process group"
    )
    raise ValueError(
        f"the Trainer trains data-parallel over {world.describe()}, but torch.distributed {group}: the "
        f"sifting loaders coordinate the Trainer's data-parallel ranks over torch.distributed, so its world "
        f"must be the Trainer's ({world.processes}). {hint}"
    )


def not_parallel_notice(world: TrainerWorld, torch_ranks: int) -> str | None:
    """What to tell a user whose processes form a group the Trainer does not train over, or None."""
    if world.processes != 1 or torch_ranks <= 1:
        return None
    return (
        f"torch.distributed has {torch_ranks} ranks but the Trainer trains over {world.describe()}: no "
        f"gradient is synchronised, each process trains all the data on its own, so sifting runs in each "
        f"process as in a one-process run (the run the Trainer makes without sifting). For data-parallel "
        f"training on CPU, set TrainingArguments(use_cpu=True)"
    )


def trainer_distributed(trainer: Any, prepared: Any) -> bool:
    """The ``distributed=`` to build a sifting loader with for ``trainer``, whose prepared train
    loader is ``prepared``; logs ``not_parallel_notice`` and raises as ``sifting_distributed``."""
    world = read_trainer_world(trainer)
    torch_ranks = torch_world_size()
    distributed = sifting_distributed(world, torch_ranks, loader_shards(prepared))
    notice = not_parallel_notice(world, torch_ranks)
    if notice is not None:
        logger.warning(notice)
    return distributed
