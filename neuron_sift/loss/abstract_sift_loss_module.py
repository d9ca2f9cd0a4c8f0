"""The per-sample loss interface users implement for scoring."""

import inspect
from typing import Any

import torch

from neuron_sift.exceptions import LossImplementationNotProvidedException


class Loss:
    """Implement ``loss`` to score a batch: one loss per sample, shape ``[n]`` (or ``[n, 1]``).

    Build the underlying criterion with ``reduction='none'``. Subclasses define their own
    ``__init__`` and need not call ``super().__init__()``; any object with a callable
    ``loss(model, transformed_batch, original_batch=None)`` is accepted as well.
    The call runs under ``torch.no_grad()`` with the model in eval mode.
    """

    def loss(self, model: torch.nn.Module, transformed_batch: Any, original_batch: Any = None) -> torch.Tensor:
        """Score a batch: one loss per sample, higher meaning the sample is more worth training on.

        Called by ``SiftingDataloader`` for every source batch after ``sift_delay``, under
        ``torch.no_grad()`` with every module in eval mode (their modes are restored
        afterwards), so the scoring pass changes neither the weights nor dropout or
        batch-norm state.

        Args:
            model: the model given to the loader (the same object, on its own device).
            transformed_batch: what ``batch_transforms.transform`` returned; with the
                default handling an internal ``SiftingBatch`` (use ``original_batch``).
            original_batch: the batch as the source loader made it. On the ``xla`` backend
                a short last batch arrives padded to the full batch size.

        Returns:
            A floating-point tensor of shape ``[n]`` or ``[n, 1]`` on the model's device,
            one value per row received; NaN and inf are allowed.

        Raises:
            LossImplementationNotProvidedException: this base method was not overridden.
        """
        raise LossImplementationNotProvidedException(
            f"{type(self).__name__} subclasses Loss but does not implement "
            "loss(self, model, transformed_batch, original_batch=None) -> Tensor[n]"
        )


def resolve_loss_fn(loss_impl: Any):
    """Return the bound ``loss`` callable of ``loss_impl`` or raise a clear error."""
    if loss_impl is None:
        raise LossImplementationNotProvidedException(
            "loss_impl is required: pass an object with a method "
            "loss(model, transformed_batch, original_batch=None) returning one loss per sample"
        )
    if isinstance(loss_impl, type) and inspect.isfunction(inspect.getattr_static(loss_impl, "loss", None)):
        # ``loss_impl=MyLoss`` without parentheses: ``loss`` would be called unbound, model as self.
        raise LossImplementationNotProvidedException(
            f"loss_impl is the class {loss_impl.__name__}, not an instance of it: pass {loss_impl.__name__}()"
        )
    shadow = getattr(loss_impl, "__dict__", {}).get("loss")
    if isinstance(shadow, torch.nn.Module):
        raise LossImplementationNotProvidedException(
            f"loss_impl.loss is an instance attribute ({type(shadow).__name__}) that hides the loss method; "
            "store the criterion under another name (e.g. self.loss_no_reduction) and implement "
            "loss(model, transformed_batch, original_batch=None)"
        )
    fn = getattr(loss_impl, "loss", None)
    if not callable(fn):
        raise LossImplementationNotProvidedException(
            f"loss_impl of type {type(loss_impl).__name__} has no callable 'loss' method; expected "
            "loss(model, transformed_batch, original_batch=None) returning one loss per sample"
        )
    if getattr(type(loss_impl), "loss", None) is Loss.loss:
        raise LossImplementationNotProvidedException(
            f"{type(loss_impl).__name__} subclasses Loss but does not override loss(model, transformed_batch, "
            "original_batch=None)"
        )
    return fn
