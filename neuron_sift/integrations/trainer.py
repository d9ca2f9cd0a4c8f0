"""smart_sifting's path of ``enable_sifting``: a Hugging Face ``transformers.Trainer`` trains on
sifted batches (``enable_sifting(trainer, sift_config, loss, set_epochs=None)``, the same call).

The integration lives in ``neuron_sift.integrations.hf_trainer`` (``per_batch.py``, whose
docstring says what the call does to the Trainer); this module is its public path.
"""

from neuron_sift.integrations.hf_trainer.per_batch import TrainerSource, enable_sifting, steps_per_epoch_for

__all__ = ["TrainerSource", "enable_sifting", "steps_per_epoch_for"]
