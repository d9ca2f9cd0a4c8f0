"""The ``SiftingDataloader``'s own arguments: checked, and what the source loader tells of them.

Why apart from the loader: a wrong argument is refused here, each refusal a ``TypeError``
naming the argument (the config's are ``SiftConfigValidationException``s, from
``sift_config/``), before any part is built; the loader keeps only its wiring. The batch
size read off the source loader decides how the default transform reads a list batch, so
it is settled here too.
"""

from typing import Any

import torch

from neuron_sift.data_model.data_model_interface import check_batch_transform
from neuron_sift.data_model.default_batch import DefaultBatchTransform
from neuron_sift.shared.sources import batch_settings, first_batch_size


def check_source(orig_dataloader: Any) -> Any:
    """``orig_dataloader`` itself, once it is an iterable of batches."""
    if orig_dataloader is None or not hasattr(orig_dataloader, "__iter__"):
        raise TypeError(f"orig_dataloader must be an iterable of batches, got {type(orig_dataloader).__name__}")
    return orig_dataloader


def check_model(model: Any) -> torch.nn.Module:
    """``model`` itself, once it is a module (a LightningModule is one)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (or LightningModule), got {type(model).__name__}")
    return model


def check_flags(**flags: Any) -> None:
    """Refuse a flag that is not a bool (a string ``"False"`` would read as true)."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")


def nominal_batch_size(source: Any) -> int | None:
    """The batch size the source DataLoader (its wrappers taken off) reports; None when it
    reports none (then the first batch's size is taken)."""
    nominal = batch_settings(source).batch_size
    return nominal if nominal is not None and nominal > 0 else None


def batch_transform_for(
    batch_transforms: Any, source: Any, batch_size: int | None, batch_format_index: int | None
) -> Any:
    """The user's transform, checked, or the default handling told the source's first
    batch's size (a short single batch when the dataset is smaller than one batch)."""
    if batch_transforms is None:
        return DefaultBatchTransform(first_batch_size(source, batch_size), batch_format_index)
    return check_batch_transform(batch_transforms)
