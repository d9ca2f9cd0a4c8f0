"""The Hugging Face ``Trainer`` integration: its two modes and the parts both share.

Users import the modes from their smart_sifting paths, ``neuron_sift.integrations.trainer``
(``enable_sifting``) and ``neuron_sift.integrations.epoch_trainer`` (``enable_epoch_sifting``).
Here: ``per_batch.py`` and ``epoch_mode.py``, each mode's hook set; ``patch.py``, the one
patcher installing them; ``checkpoint.py``, the sifted stream in the Trainer's checkpoints;
``ranks.py``, the Trainer's data-parallel world; ``run_length.py``, the epoch mode's run held
to its plan; ``optimizer.py``, a fused AdamW on XLA refused at the call.

Importing this package needs neither transformers nor accelerate.
"""
