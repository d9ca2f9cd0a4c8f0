"""Both sifting loaders in ``torch.distributed.checkpoint`` (DCP), beside the model and the
optimizer: ``{"loader": PerRankLoaderState(loader)}`` in the state dict given to
``dcp.save`` / ``dcp.async_save`` / ``dcp.load``, and ``planner=ReshardingLoadPlanner()``
on every load: it reaches a checkpoint of another world size, and says what is wrong where
DCP's own planner stops at a bare "Missing key".

Why an adapter and not the loader itself as the DCP value: DCP calls the same
``state_dict()`` / ``load_state_dict()`` as ``torch.save`` users and the Trainer do, with
no way to tell them apart, and a loader's state does not fit what DCP expects of one:

- DCP loads *into* the structure of the fresh object's ``state_dict()``. A fresh loader's
  state has other keys than a mid-epoch one (no plan yet: "Missing key in checkpoint
  state_dict: loader.progress.plan") and tensors of other sizes (a plan's order, pending
  samples), which DCP cannot resize.
- DCP keeps one value per key for the whole job (equal keys of different ranks are saved
  once, as for a replicated model), while each rank's loader state is its own.
- ``dcp.async_save`` writes while training goes on changing the loader.

Changing what ``state_dict()`` returns would break its other users, so the adapter stores
the loader's state as one opaque value per process, ``{"rank{r}_of{W}": bytes}`` (torchtitan
keys its dataloaders' states by data-parallel rank the same way): ``torch.save`` of an entry
(``loader_entries.py``: the loader's state and the process that wrote it), taken when DCP asks for
it, so a save in flight holds a snapshot nothing later changes; read back with
``weights_only=True`` and the checksums. DCP writes the bytes with its own metadata,
atomically (the checkpoint's ``.metadata`` is written last, once every rank wrote).

Why the key is the process's rank, not the loader's: a loader built with
``distributed=False`` under DDP runs on its own (rank 0 of 1) in every process, and keys of
its ranks would all be ``rank0_of1``, which DCP saves once: every process would resume the
state of one of them. So the key is the default process group's rank and size whenever one
is initialised (the loader's own, 0 of 1, otherwise), and each entry names the process that
wrote it, checked on load.

Why a load planner: DCP asks for exactly the keys the fresh ``state_dict()`` lists, before
it reads anything, and a rank of a new job cannot know the old world size. At the same world
size each rank's own key is there and plain ``dcp.load`` restores each rank exactly.
``ReshardingLoadPlanner`` is DCP's default load planner plus three steps: where the
checkpoint has no entry of this rank's key, it asks for every old rank's entry instead
(found in the checkpoint's metadata), which the adapter hands to the loader's
``load_state_dict_from_ranks`` (the epoch loader, or ``ExactLengthLoader`` around one; the
per-batch loader, which does not resume at another world size, is refused naming both world
sizes); it reads the loader entries with ``weights_only=True`` (DCP's own planner unpickles
every non-tensor value without it), and a damaged entry is refused naming the entry and the
checkpoint; and a loader given to DCP itself is told apart (DCP has already turned it into
its ``state_dict()``, which names its kind) and refused with what to do.
"""

import io
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.stateful import Stateful

from neuron_sift.integrations.loader_entries import (
    EntryPlace,
    damaged,
    process_rank,
    read_entry,
    written_entry,
)

__all__ = ["PerRankLoaderState", "RankStates", "ReshardingLoadPlanner", "rank_key"]

_RANK_KEY = re.compile(r"rank(\d+)_of(\d+)")


def rank_key(rank: int, world_size: int) -> str:
    """The key of process ``rank``'s loader state in a checkpoint taken by ``world_size`` processes."""
    return f"rank{rank}_of{world_size}"


class RankStates(dict[str, Any]):
    """A loader's entries in a DCP state dict, ``{rank_key: serialized entry}``: a dict (DCP
    saves and loads each entry as one value) marked so that ``ReshardingLoadPlanner`` finds
    the loaders' entries among the model's and optimizer's. ``place`` names them in messages
    (the planner sets it: the entry's path in the state dict and the checkpoint)."""

    place: EntryPlace = EntryPlace()


class PerRankLoaderState(Stateful):
    """A sifting loader as a value of a DCP state dict: each process's state under its own key,
    serialized when DCP asks for it (see the module's docstring for why).

    Args:
        loader: a ``SiftingDataloader`` or ``EpochSiftingDataloader`` (or a wrapper that hands
            on their ``state_dict``, ``load_state_dict`` and ``ranks``, as ``ExactLengthLoader``
            does). Its entry is keyed by the default process group's rank and world size when
            one is initialised, else by the loader's own (``loader.ranks``).

    Raises:
        TypeError: ``loader`` has no loader state API.
    """

    def __init__(self, loader: Any) -> None:
        missing = [name for name in ("state_dict", "load_state_dict", "ranks") if not hasattr(loader, name)]
        if missing:
            raise TypeError(
                f"PerRankLoaderState wraps a SiftingDataloader or EpochSiftingDataloader; got a {type(loader).__name__} "
                f"without {', '.join(missing)}"
            )
        self.loader = loader

    @property
    def key(self) -> str:
        """This process's entry: ``rank{r}_of{W}``."""
        return rank_key(*process_rank(self.loader.ranks))

    def state_dict(self) -> RankStates:
        """This process's entry with the loader's state as it is now (a snapshot: bytes)."""
        return RankStates({self.key: written_entry(self.loader.state_dict(), process_rank(self.loader.ranks))})

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore this process's own entry; given every rank's entries of a checkpoint of
        another world size (``ReshardingLoadPlanner``), resume from all of them.

        Raises:
            ValueError: no entry of this process and not every rank's of one other world size;
                an entry that cannot be read (damaged, or no loader state), written by another
                process than its key says; a loader that does not resume at another world size
                (``SiftingDataloader``, or any loader built with ``distributed=False``); the
                loader's own refusals (another run, other settings). Each names the entry.
        """
        place = state_dict.place if isinstance(state_dict, RankStates) else EntryPlace()
        me = process_rank(self.loader.ranks)
        if self.key in state_dict:
            state = read_entry(state_dict[self.key], place.of(self.key), expected_writer=me)
            with place.of(self.key).naming_refusals():
                self.loader.load_state_dict(state)
            return
        found = {}
        for key in state_dict:
            match = _RANK_KEY.fullmatch(str(key))
            if match:
                found[key] = (int(match.group(1)), int(match.group(2)))
        worlds = {world for _, world in found.values()}
        ranks = sorted(rank for rank, _ in found.values())
        if len(worlds) != 1 or ranks != list(range(next(iter(worlds)))):
            raise ValueError(
                f"the checkpoint{place.checkpoint_words()} holds no loader state of this process ({self.key}) and not "
                f"every rank's state of one other world size: got {sorted(map(str, state_dict)) or 'none'}. Load at "
                "another world size with dcp.load(..., planner=ReshardingLoadPlanner())"
            )
        saved_world = next(iter(worlds))
        _check_reshardable(self.loader, saved_world, me[1], place)
        keys = sorted(found, key=lambda k: found[k][0])
        states = [read_entry(state_dict[key], place.of(key), expected_writer=found[key]) for key in keys]
        with place.naming_refusals():
            self.loader.load_state_dict_from_ranks(states)


def _check_reshardable(loader: Any, saved_world: int, world: int, place: EntryPlace) -> None:
    """Refuse, naming both world sizes, a loader that cannot resume ``saved_world`` ranks'
    states at ``world`` processes."""
    saved = f"saved by {saved_world} process(es), this run has {world}"
    if loader.ranks.world_size != world:
        raise ValueError(
            f"the checkpoint{place.checkpoint_words()} was {saved}, and this {type(loader).__name__} runs on its own "
            "in each process (distributed=False): each process resumes only its own entry, at the world size it "
            "was saved at. Restart with the saving world size, or build the loaders with distributed=None so they "
            "share their work over the ranks and resume at another world size (EpochSiftingDataloader)"
        )
    if not callable(getattr(loader, "load_state_dict_from_ranks", None)):
        raise ValueError(
            f"the checkpoint{place.checkpoint_words()} was {saved}: {type(loader).__name__} resumes only at the "
            "world size it was saved at (each rank's pending samples and random state do not divide among other "
            f"ranks). Restart with {saved_world} process(es), or start this loader afresh (load the model and "
            "optimizer without the loader's entry); EpochSiftingDataloader resumes at another world size"
        )


_LOADER_KINDS = ("SiftingDataloader", "EpochSiftingDataloader", "ExactLengthLoader")


def _values(value: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every ``RankStates`` and every loader's own state in a state dict, with its path of keys."""
    if isinstance(value, RankStates) or (isinstance(value, Mapping) and value.get("kind") in _LOADER_KINDS):
        return [(path, value)]
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in _values(item, (*path, str(key)))]
    return []


def _checkpoint_id(metadata: Metadata | None) -> str | None:
    """The checkpoint's name as its writer recorded it (DCP's storage metadata), if any."""
    storage = getattr(metadata, "storage_meta", None)
    checkpoint_id = getattr(storage, "checkpoint_id", None)
    return None if checkpoint_id is None else str(checkpoint_id)


class ReshardingLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner that also resumes loaders saved at another world size: for
    each ``PerRankLoaderState`` whose process has no entry in the checkpoint, it asks for
    every old rank's entry instead (found in the checkpoint's metadata), which the adapter
    hands to ``load_state_dict_from_ranks``. At the same world size it plans what the default
    planner plans. Loader entries are read with ``weights_only=True``. Where DCP's own planner
    would stop at a bare "Missing key" or an unpickling error, it says what is wrong: a loader
    given to ``dcp.load`` itself, a checkpoint that saved a loader itself or none, a damaged
    entry. Keyword arguments go to ``DefaultLoadPlanner``.

    Raises (from ``dcp.load``, inside its ``CheckpointException``, which names the rank and
    derives from ``BaseException``: ``except Exception`` does not catch it):
        TypeError: a loader itself is a value of the state dict (wrap it: ``PerRankLoaderState``).
        ValueError: the checkpoint holds no loader entries where the state dict has one, or
            holds a loader's own state there (it was saved without ``PerRankLoaderState``), or
            an entry that cannot be read (naming it and the checkpoint).
    """

    def set_up_planner(self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        checkpoint = _checkpoint_id(metadata)
        self._loader_entries: dict[str, EntryPlace] = {}
        for path, entries in _values(state_dict):
            name = ".".join(path)
            if not isinstance(entries, RankStates):
                raise TypeError(
                    f"{name!r} is a {entries['kind']} itself: DCP loads into the structure of the fresh loader's state, "
                    "which differs from a saved one, and keeps one value per key for all ranks. "
                    f"Give dcp.save and dcp.load PerRankLoaderState(loader) as {name!r}"
                )
            entries.place = EntryPlace(name, checkpoint)
            if metadata is None:
                continue
            prefix = name + "."
            saved = [fqn[len(prefix) :] for fqn in metadata.state_dict_metadata if fqn.startswith(prefix)]
            theirs = [key for key in saved if _RANK_KEY.fullmatch(key)]
            if saved and not theirs:
                raise ValueError(
                    f"the checkpoint's {name!r} holds a loader's own state (the loader itself was given to dcp.save), "
                    f"which holds one rank's state only: save PerRankLoaderState(loader) as {name!r}"
                )
            if not theirs:
                raise ValueError(
                    f"the checkpoint holds no loader state under {name!r}: it was saved without "
                    f"PerRankLoaderState(loader) as {name!r} (it holds {sorted({k.split('.')[0] for k in metadata.state_dict_metadata})})"
                )
            if not any(key in theirs for key in entries):  # no entry of this process: every old rank's
                entries.clear()  # DCP replaces each placeholder with the saved value
                entries.update(dict.fromkeys(theirs, b""))
            self._loader_entries.update({prefix + key: entries.place.of(key) for key in entries})
        super().set_up_planner(state_dict, metadata, is_coordinator)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """A loader entry is read with ``weights_only=True`` first (a damaged one is refused
        by name); everything else as DCP's default planner reads it."""
        place = getattr(self, "_loader_entries", {}).get(read_item.dest_index.fqn)
        if place is not None:
            data = value.read()
            try:
                blob = torch.load(io.BytesIO(data), weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any failure to read is one refusal, naming the entry
                raise damaged(place, exc) from exc
            if not isinstance(blob, (bytes, bytearray)):
                raise ValueError(f"{place.describe()} is a {type(blob).__name__}, not a saved loader state")
            value = io.BytesIO(data)
        super().load_bytes(read_item, value)
