"""Integrations: the Hugging Face ``Trainer`` (``neuron_sift.integrations.trainer.enable_sifting``,
``neuron_sift.integrations.epoch_trainer.enable_epoch_sifting``; the integration's room is
``hf_trainer/``) and lengths for schedules and trainers (``neuron_sift.integrations.schedules``).
Both loaders in ``torch.distributed.checkpoint``: ``PerRankLoaderState`` and
``ReshardingLoadPlanner`` (``neuron_sift.integrations.distributed_checkpoint``, imported on first use).
Lightning's resume from a checkpoint: ``neuron_sift.integrations.lightning_checkpoint.SiftingResume``.

Importing this package needs neither transformers nor accelerate.
"""

from typing import Any

from neuron_sift.integrations.schedules import (
    ExactLengthLoader,
    batches_per_epoch,
    planned_steps,
    planned_steps_std,
)

__all__ = [
    "ExactLengthLoader",
    "PerRankLoaderState",
    "ReshardingLoadPlanner",
    "batches_per_epoch",
    "planned_steps",
    "planned_steps_std",
]

_DISTRIBUTED_CHECKPOINT = ("PerRankLoaderState", "ReshardingLoadPlanner")


def __getattr__(name: str) -> Any:
    """The DCP adapters, imported when first asked for: torch.distributed.checkpoint is a
    sizeable import that only runs using it need."""
    if name in _DISTRIBUTED_CHECKPOINT:
        from neuron_sift.integrations import distributed_checkpoint

        return getattr(distributed_checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
