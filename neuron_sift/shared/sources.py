"""The user's DataLoader behind its wrappers, and how it batches: what both loaders and the
Trainer integration read from it.

One unwrapping rule for the package (``unwrap``): the per-batch ``SiftingDataloader`` and
the Trainer integration read the batch size and the epoch size from the DataLoader inside
the user's wrappers, and ``EpochSiftingDataloader`` rebuilds the same wrappers around a
DataLoader of its own. Wrappers are recognised by the attribute holding the next loader:

- ``_loader``: torch-xla's ``MpDeviceLoader``, and accelerate's ``MpDeviceLoaderWrapper``
  (what ``accelerator.prepare`` returns, and the Trainer trains on, wherever torch-xla is
  installed, even on the CPU);
- ``base_dataloader``: accelerate's ``DataLoaderAdapter`` family (``DataLoaderShard``,
  ``DataLoaderDispatcher``, ``SkipDataLoader``). These answer ``isinstance(x, DataLoader)``
  through a ``__class__`` property while holding the real DataLoader inside, so the walk
  tests the object's type; keeping the adapter in the chain keeps what it does per
  iteration (device placement, RNG synchronisation, the gradient state's end of epoch).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

WRAPPER_ATTRIBUTES = ("_loader", "base_dataloader")
_MAX_WRAPPERS = 8


def is_dataloader(obj: Any) -> bool:
    """Whether ``obj``'s own type is a DataLoader (accelerate's adapters only claim to be one)."""
    return issubclass(type(obj), DataLoader)


@dataclass(frozen=True)
class LoaderChain:
    """The user's loader taken apart: ``wrappers`` from the outside in, each with the name of
    the attribute that holds the next one, and the ``inner`` object the walk stopped at."""

    wrappers: tuple[tuple[Any, str], ...]
    inner: Any

    @property
    def reaches_dataloader(self) -> bool:
        return is_dataloader(self.inner)

    def objects(self) -> Iterator[Any]:
        """Every object of the chain, from the user's one inward."""
        for wrapper, _ in self.wrappers:
            yield wrapper
        yield self.inner

    def describe(self) -> str:
        return " -> ".join(f"{type(w).__name__}.{attr}" for w, attr in self.wrappers) + (
            f"{' -> ' if self.wrappers else ''}{type(self.inner).__name__}"
        )


def unwrap(loader: Any) -> LoaderChain:
    """Follow ``WRAPPER_ATTRIBUTES`` from ``loader`` down to the first real DataLoader (or to
    an object holding none of them); raises ``TypeError`` past ``_MAX_WRAPPERS`` wrappers,
    which only a loader wrapping itself reaches."""
    wrappers: list[tuple[Any, str]] = []
    node = loader
    while not is_dataloader(node):
        attr = next((a for a in WRAPPER_ATTRIBUTES if getattr(node, a, None) is not None), None)
        if attr is None:
            break
        if len(wrappers) == _MAX_WRAPPERS:
            raise TypeError(
                f"{type(loader).__name__} nests more than {_MAX_WRAPPERS} loader wrappers "
                f"({', '.join(WRAPPER_ATTRIBUTES)}); does a wrapper hold itself?"
            )
        wrappers.append((node, attr))
        node = getattr(node, attr)
    return LoaderChain(tuple(wrappers), node)


def underlying_dataloader(loader: Any) -> Any:
    """The DataLoader inside the user's wrappers (see ``unwrap``), to learn the batch size and
    plan the length; iteration always goes through the loader the user passed.

    A source with no DataLoader inside (a loader class of the user's own) is read where it
    first reports a batch size or a batch sampler, or else where the walk stopped.
    """
    chain = unwrap(loader)
    if chain.reaches_dataloader:
        return chain.inner
    for node in chain.objects():
        if getattr(node, "batch_size", None) is not None or getattr(node, "batch_sampler", None) is not None:
            return node
    return chain.inner


@dataclass(frozen=True)
class BatchSettings:
    """How a DataLoader batches: ``batch_size`` (None if it has none), ``drop_last`` and the
    ``sampler`` it draws indices from (None if unknown), read from the loader or, for one
    built with ``batch_sampler=`` (accelerate's loaders among them), from its batch sampler.
    ``batch_sampler``: that batch sampler (None when the loader batches itself)."""

    batch_size: int | None
    drop_last: bool
    sampler: Any
    batch_sampler: Any


def batch_settings(loader: Any) -> BatchSettings:
    """The one reading of a DataLoader's batching, for every part that plans from it."""
    b = getattr(loader, "batch_size", None)
    if isinstance(b, int) and not isinstance(b, bool):
        return BatchSettings(b, bool(getattr(loader, "drop_last", False)), getattr(loader, "sampler", None), None)
    bs = getattr(loader, "batch_sampler", None)
    b = getattr(bs, "batch_size", None)
    return BatchSettings(
        b if isinstance(b, int) and not isinstance(b, bool) else None,
        bool(getattr(bs, "drop_last", False)),
        getattr(bs, "sampler", None),
        bs,
    )


def sampler_info(loader: Any) -> tuple[int, int, bool] | None:
    """(batch size, samples per epoch, drop_last) of a DataLoader, or None if unknown."""
    settings = batch_settings(loader)
    b = settings.batch_size
    if b is None or b < 1 or settings.sampler is None:
        return None
    try:
        return b, len(settings.sampler), settings.drop_last
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
