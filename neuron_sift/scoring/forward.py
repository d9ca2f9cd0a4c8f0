"""The scoring pass: the user's loss in eval mode without gradients, and its checks (both modes and the reference scorer use it)."""

import contextlib
from typing import Any

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.exceptions import LossOutputException

# The autocast type of each ``scoring_precision`` below the model's own.
SCORING_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class scoring_mode:
    """Eval mode and no gradients for the scoring pass; every module's mode is restored.

    ``model.eval()`` is called (not each flag set directly), so a model whose ``train()``
    is overridden keeps its own behaviour. A class, not a generator context manager: this
    runs once per source batch. ``inference``: the backend's ``inference_mode()`` context
    instead of ``no_grad``; ``autocast``: a lower precision's autocast context, for scoring
    only (``RelativeProbabilisticSiftConfig.scoring_inference_mode``, ``scoring_precision``).
    """

    __slots__ = ("model", "modes", "grad", "inference", "autocast", "inner")

    def __init__(
        self,
        model: torch.nn.Module,
        inference: contextlib.AbstractContextManager[Any] | None = None,
        autocast: contextlib.AbstractContextManager[Any] | None = None,
    ):
        self.model = model
        self.inference = inference
        self.autocast = autocast

    def __enter__(self) -> None:
        self.modes = [(m, m.training) for m in self.model.modules()]
        self.grad = torch.is_grad_enabled()
        self.model.eval()
        self.inner: list[contextlib.AbstractContextManager[Any]] = []
        if self.inference is not None:
            self.inner.append(self.inference)
        else:
            torch.set_grad_enabled(False)
        if self.autocast is not None:
            self.inner.append(self.autocast)
        for context in self.inner:
            context.__enter__()

    def __exit__(self, *exc) -> None:
        for context in reversed(self.inner):
            context.__exit__(*exc)
        torch.set_grad_enabled(self.grad)
        for m, training in self.modes:
            m.training = training


def check_losses(losses: Any, n: int, backend: Backend) -> torch.Tensor:
    """One floating-point loss per sample on the model's device, as a ``[n]`` tensor."""
    if not isinstance(losses, torch.Tensor):
        raise LossOutputException(
            f"loss_impl.loss must return a torch.Tensor with one loss per sample, got {type(losses).__name__}"
        )
    shape = losses.shape
    if len(shape) == 2 and shape[1] == 1:
        losses = losses[:, 0]
        shape = losses.shape
    if len(shape) != 1 or shape[0] != n:
        raise LossOutputException(
            f"loss_impl.loss must return one loss per sample: expected shape [{n}] (or [{n}, 1]), got "
            f"{list(shape)}; build the criterion with reduction='none' and reduce any per-token "
            "losses to one value per sample"
        )
    if not losses.dtype.is_floating_point:
        raise LossOutputException(f"loss_impl.loss must return a floating-point tensor, got dtype {losses.dtype}")
    if not backend.same_device(losses.device, backend.device):
        raise LossOutputException(
            f"loss_impl.loss returned losses on {losses.device} but the model is on {backend.device}; "
            "compute the loss on the model's device"
        )
    if losses.dtype in (torch.bfloat16, torch.float16):
        losses = losses.float()  # ranked as float32 (exact: every half value is a float32)
    return losses.detach() if losses.requires_grad else losses
