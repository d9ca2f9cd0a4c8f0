"""The public path of ``enable_epoch_sifting``: a Hugging Face ``transformers.Trainer`` trains
with epoch-level sifting (``enable_epoch_sifting(trainer, sift_config, per_sample_loss=None)``).

The integration lives in ``neuron_sift.integrations.hf_trainer`` (``epoch_mode.py``, whose
docstring says what the call does to the Trainer); this module is its public path, with
``state_file`` (the checkpoint file of a process's epoch-sifting state), the per-sample
losses, and ``restore_at_epoch_end`` (its path before ``hf_trainer.checkpoint`` existed).
"""

from neuron_sift.integrations.hf_trainer.checkpoint import restore_at_epoch_end
from neuron_sift.integrations.hf_trainer.epoch_mode import (
    enable_epoch_sifting,
    per_sample_causal_lm,
    per_sample_classification,
    state_file,
)

__all__ = [
    "enable_epoch_sifting",
    "per_sample_causal_lm",
    "per_sample_classification",
    "restore_at_epoch_end",
    "state_file",
]
