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
the loader's state as one opaque value per data-parallel rank, ``{"rank{r}_of{W}": bytes}``
(torchtitan keys its dataloaders' states by data-parallel rank the same way): ``torch.save`` of the state, taken when DCP
asks for it, so a save in flight holds a snapshot nothing later changes; read back with
``weights_only=True`` and the state's own checksum. DCP writes the bytes with its own
metadata, atomically (the checkpoint's ``.metadata`` is written last, once every rank wrote).

Why a load planner: DCP asks for exactly the keys the fresh ``state_dict()`` lists, before
it reads anything, and a rank of a new job cannot know the old world size. At the same world
size each rank's own key is there and plain ``dcp.load`` restores each rank exactly.
``ReshardingLoadPlanner`` is DCP's default load planner plus one step: where the checkpoint
has no entry of this rank's key, it asks for every old rank's state instead, and the adapter
hands them to ``EpochSiftingDataloader.load_state_dict_from_ranks`` (the per-batch loader,
which does not resume at another world size, refuses with its own message). The planner is
also where a loader given to DCP itself can be told apart (DCP has already turned it into
its ``state_dict()``, which names its kind), so it is refused there with what to do.
"""

import io
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.stateful import Stateful

__all__ = ["PerRankLoaderState", "RankStates", "ReshardingLoadPlanner", "rank_key"]

_RANK_KEY = re.compile(r"rank(\d+)_of(\d+)")


def rank_key(rank: int, world_size: int) -> str:
    """The key of rank ``rank``'s loader state in a checkpoint taken by ``world_size`` ranks."""
    return f"rank{rank}_of{world_size}"


class RankStates(dict[str, Any]):
    """A loader's entries in a DCP state dict, ``{rank_key: serialized state}``: a dict (DCP
    saves and loads each entry as one value) marked so that ``ReshardingLoadPlanner`` finds
    the loaders' entries among the model's and optimizer's."""


def _serialized(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _deserialized(blob: Any, key: str) -> dict[str, Any]:
    if not isinstance(blob, (bytes, bytearray)):
        raise ValueError(f"the checkpoint's loader entry {key!r} is a {type(blob).__name__}, not a saved loader state")
    state = torch.load(io.BytesIO(blob), weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"the checkpoint's loader entry {key!r} holds a {type(state).__name__}, not a loader state")
    return state


class PerRankLoaderState(Stateful):
    """A sifting loader as a value of a DCP state dict: each data-parallel rank's state under
    its own key, serialized when DCP asks for it (see the module's docstring for why).

    Args:
        loader: a ``SiftingDataloader`` or ``EpochSiftingDataloader`` (or a wrapper that hands
            on their ``state_dict``, ``load_state_dict`` and ``ranks``). Its rank and world size
            (``loader.ranks``: the process group the loader shares its work with) name its entry.

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
        """This rank's entry: ``rank{r}_of{W}``."""
        return rank_key(self.loader.ranks.rank, self.loader.ranks.world_size)

    def state_dict(self) -> RankStates:
        """This rank's entry with the loader's state as it is now (a snapshot: bytes)."""
        return RankStates({self.key: _serialized(self.loader.state_dict())})

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore this rank's own entry; given every rank's entries of a checkpoint of another
        world size (``ReshardingLoadPlanner``), resume from all of them.

        Raises:
            ValueError: no entry of this rank and not every rank's of one other world size; an
                entry that is no loader state; the loader's own refusals (another run, a damaged
                state, ``SiftingDataloader`` at another world size).
        """
        if self.key in state_dict:
            self.loader.load_state_dict(_deserialized(state_dict[self.key], self.key))
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
                f"the checkpoint holds no loader state of this rank ({self.key}) and not every rank's state of one other "
                f"world size: got {sorted(map(str, state_dict)) or 'none'}. Load at another world size with "
                "dcp.load(..., planner=ReshardingLoadPlanner())"
            )
        states = [_deserialized(state_dict[key], key) for key in sorted(found, key=lambda k: found[k][0])]
        if hasattr(self.loader, "load_state_dict_from_ranks"):
            self.loader.load_state_dict_from_ranks(states)
            return
        # The per-batch loader refuses a state of another world size with its own message.
        self.loader.load_state_dict(states[min(self.loader.ranks.rank, len(states) - 1)])
        raise ValueError(
            f"{type(self.loader).__name__} resumes only at the world size it was saved at ({len(states)} ranks, "
            f"this run has {self.loader.ranks.world_size})"
        )


_LOADER_KINDS = ("SiftingDataloader", "EpochSiftingDataloader", "ExactLengthLoader")


def _values(value: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every ``RankStates`` and every loader's own state in a state dict, with its path of keys."""
    if isinstance(value, RankStates) or (isinstance(value, Mapping) and value.get("kind") in _LOADER_KINDS):
        return [(path, value)]
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in _values(item, (*path, str(key)))]
    return []


class ReshardingLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner that also resumes loaders saved at another world size: for
    each ``PerRankLoaderState`` whose rank has no entry in the checkpoint, it asks for every
    old rank's entry instead (found in the checkpoint's metadata), which the adapter hands to
    ``load_state_dict_from_ranks``. At the same world size it plans what the default planner
    plans. Where DCP's own planner would stop at a bare "Missing key", it says what is wrong:
    a loader given to ``dcp.load`` itself, a checkpoint that saved a loader itself or none.
    Keyword arguments go to ``DefaultLoadPlanner``.

    Raises (from ``dcp.load``, inside its ``CheckpointException``, which names the rank):
        TypeError: a loader itself is a value of the state dict (wrap it: ``PerRankLoaderState``).
        ValueError: the checkpoint holds no loader entries where the state dict has one, or
            holds a loader's own state there (it was saved without ``PerRankLoaderState``).
    """

    def set_up_planner(self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        for path, entries in _values(state_dict):
            name = ".".join(path)
            if not isinstance(entries, RankStates):
                raise TypeError(
                    f"{name!r} is a {entries['kind']} itself: DCP loads into the structure of the fresh loader's state, "
                    "which differs from a saved one, and keeps one value per key for all ranks. "
                    f"Give dcp.save and dcp.load PerRankLoaderState(loader) as {name!r}"
                )
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
            if any(key in theirs for key in entries):
                continue  # this rank's own entry: the exact resume
            entries.clear()  # DCP replaces each placeholder with the saved value
            entries.update(dict.fromkeys(theirs, b""))
        super().set_up_planner(state_dict, metadata, is_coordinator)
