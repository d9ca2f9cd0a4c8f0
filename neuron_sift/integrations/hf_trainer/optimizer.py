"""Refuse, at ``enable_sifting`` / ``enable_epoch_sifting``, a Trainer whose first step would fail on XLA.

Why: with torch 2.8 or later, transformers 4.54 and later (the Neuron container's 4.56, every
5.x) default ``TrainingArguments.optim`` to ``"adamw_torch_fused"``, and torch's fused AdamW
takes no XLA tensors. On an XLA device such a Trainer, with or without sifting, runs its
first forward and backward and then fails in the optimizer step with torch's "fused=True
requires all the params to be floating point Tensors of supported devices". Refusing at the
call names the setting to change before anything is compiled.

Only what the Trainer would build itself is checked: an optimizer given to the Trainer
(``optimizers=(optimizer, scheduler)``, ``optimizer_cls_and_kwargs``) is the user's own. The
device list is torch's own (``backends.fused_optimizers_refuse_xla``), so a torch whose
fused AdamW takes XLA tensors is not refused.
"""

from typing import Any

from neuron_sift.backends import fused_optimizers_refuse_xla

FUSED_ADAMW = "adamw_torch_fused"


def check_trainer_optimizer(trainer: Any, caller: str) -> None:
    """Raise ``ValueError`` where ``trainer`` would build torch's fused AdamW on an XLA device."""
    args = trainer.args
    optim = getattr(args, "optim", None)
    if getattr(optim, "value", optim) != FUSED_ADAMW:
        return
    if getattr(trainer, "optimizer", None) is not None or getattr(trainer, "optimizer_cls_and_kwargs", None):
        return
    device = getattr(args, "device", None)
    supported = fused_optimizers_refuse_xla(device)
    if supported is None:
        return
    raise ValueError(
        f"{caller}: the Trainer trains on the XLA device {device} with optim={FUSED_ADAMW!r} (transformers' "
        f"default from 4.54 on with torch 2.8 or later), and torch's fused AdamW does not take XLA tensors "
        f'(it accepts {", ".join(supported)}): the first optimizer step would fail. Pass optim="adamw_torch" to '
        f"TrainingArguments, or give the Trainer an optimizer of your own (optimizers=(optimizer, scheduler))"
    )
