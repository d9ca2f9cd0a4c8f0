"""Integrations: the Hugging Face ``Trainer`` (``neuron_sift.integrations.trainer.enable_sifting``)
and lengths for schedules and trainers (``neuron_sift.integrations.schedules``).

Importing this package needs neither transformers nor accelerate.
"""

from neuron_sift.integrations.schedules import (
    ExactLengthLoader,
    batches_per_epoch,
    epoch_plan,
    planned_steps,
    planned_steps_std,
)

__all__ = ["ExactLengthLoader", "batches_per_epoch", "epoch_plan", "planned_steps", "planned_steps_std"]
