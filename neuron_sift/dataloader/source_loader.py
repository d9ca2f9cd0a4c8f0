"""What the loader learns from the source DataLoader: batch size, epoch size, wrappers."""

from typing import Any


def underlying_dataloader(loader: Any) -> Any:
    """The DataLoader inside wrappers such as torch-xla's ``MpDeviceLoader`` (``._loader``):
    the first object with a batch size or a batch sampler (accelerate's prepared loaders have
    only the latter).

    Used only to learn the batch size and plan the length; iteration always goes through
    the loader the user passed. The one unwrapping helper of the package.
    """
    seen = 0
    while (
        getattr(loader, "batch_size", None) is None
        and getattr(loader, "batch_sampler", None) is None
        and hasattr(loader, "_loader")
        and seen < 8
    ):
        loader = loader._loader
        seen += 1
    return loader


def sampler_info(loader: Any) -> tuple[int, int, bool] | None:
    """(batch size, samples per epoch, drop_last) of a DataLoader, or None if unknown.

    Reads ``batch_size``/``drop_last``/``sampler`` or, for a loader built with
    ``batch_sampler=`` (accelerate's loaders among them), the batch sampler's.
    """
    b, drop_last, sampler = getattr(loader, "batch_size", None), getattr(loader, "drop_last", False), None
    if isinstance(b, int):
        sampler = getattr(loader, "sampler", None)
    else:
        bs = getattr(loader, "batch_sampler", None)
        b = getattr(bs, "batch_size", None)
        drop_last = bool(getattr(bs, "drop_last", False))
        sampler = getattr(bs, "sampler", None)
    if not isinstance(b, int) or b < 1 or sampler is None:
        return None
    try:
        return b, len(sampler), bool(drop_last)
    except TypeError:
        return None


def first_batch_size(loader: Any, batch_size: int | None) -> int | None:
    """Samples in the source loader's first batch: the batch size, or fewer when the whole
    dataset is smaller (then that single batch is short). Used to tell which dimension of a
    list holds the samples."""
    info = sampler_info(loader)
    if batch_size is not None and info is not None and 0 < info[1] < batch_size and not info[2]:
        return info[1]
    return batch_size
