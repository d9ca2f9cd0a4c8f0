"""The user's DataLoader rebuilt with a sampling of the library's own: every other setting
kept, and its wrappers copied around the new one.

Why one place: the epoch loader replaces the sampling with its plans, and the per-batch
loader wraps the user's batch sampler to learn each batch's sample ids; both must keep the
user's workers, collate function, pinning and wrappers (torch-xla's ``MpDeviceLoader``,
accelerate's adapters: ``sources.unwrap``) exactly as they were. Nothing is patched: the
user's objects stay as they were, the wrappers are shallow copies.
"""

import copy
from typing import Any

from torch.utils.data import DataLoader


def dataloader_settings(src: "DataLoader[Any]") -> dict[str, Any]:
    """The user's DataLoader settings that a rebuilt one keeps (all but its sampling)."""
    kwargs: dict[str, Any] = dict(
        num_workers=src.num_workers,
        collate_fn=src.collate_fn,
        pin_memory=src.pin_memory,
        timeout=src.timeout,
        worker_init_fn=src.worker_init_fn,
        multiprocessing_context=src.multiprocessing_context,
        generator=src.generator,
        persistent_workers=src.persistent_workers,
        pin_memory_device=src.pin_memory_device,
    )
    if src.num_workers > 0:
        kwargs["prefetch_factor"] = src.prefetch_factor
    if hasattr(src, "in_order"):
        kwargs["in_order"] = src.in_order
    return kwargs


def with_wrappers(node: Any, wrappers: tuple[tuple[Any, str], ...]) -> Any:
    """``node`` inside copies of the user's ``wrappers`` (outermost first, each with the
    attribute holding the next), so whatever they do per batch still happens."""
    for wrapper, attribute in reversed(wrappers):  # shallow copies: the user's wrappers stay as they were
        outer = copy.copy(wrapper)
        setattr(outer, attribute, node)
        node = outer
    return node
