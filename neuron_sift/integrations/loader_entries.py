"""One process's loader entry in a ``torch.distributed.checkpoint`` checkpoint: written as
bytes, read back whole or refused by name.

Why an envelope of its own around the loader's state: DCP saves equal keys of different
processes once, so an entry must say which process wrote it, and a reader must tell a
damaged entry from a loader's refusal. An entry is ``torch.save`` of
``{"kind": "PerRankLoaderState", "version": 1, "rank", "world_size", "loader", "checksum"}``
(the package's envelope: ``neuron_sift.shared.checkpoints``): the process's rank and world
size, and the loader's own state, sealed by its own checksum. Entries of 0.8.0 are the
loader's state itself (no writer recorded) and still load.

Every failure to read an entry (unpickling, a zip member, a decode, a checksum, a writer
that is not the reader) is one ``ValueError`` naming the entry and the checkpoint
(``EntryPlace``): whatever byte a damaged file has wrong, the user reads which entry of
which checkpoint cannot be used, not an ``UnpicklingError`` from deep inside ``torch.load``.
"""

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from neuron_sift.shared.checkpoints import StateFormat, state_kind, verify_checksum
from neuron_sift.shared.state_checks import describe, need_int

ENTRY = StateFormat("PerRankLoaderState", 1, ("rank", "world_size", "loader"))
LOADER_KINDS = ("SiftingDataloader", "EpochSiftingDataloader", "ExactLengthLoader")


@dataclass(frozen=True)
class EntryPlace:
    """Where an entry is, for messages: its path in the state dict (``loader``), its key
    (``rank1_of2``) and the checkpoint it was read from (DCP's storage metadata names the
    checkpoint its writer saved to). Unknown parts are left out of the words."""

    path: str | None = None
    checkpoint: str | None = None
    key: str | None = None

    def of(self, key: str) -> "EntryPlace":
        return replace(self, key=key)

    def checkpoint_words(self) -> str:
        return "" if self.checkpoint is None else f" {self.checkpoint!r}"

    def describe(self) -> str:
        name = ".".join(part for part in (self.path, self.key) if part) or "?"
        return f"the loader entry {name!r} of the checkpoint{self.checkpoint_words()}"

    @contextlib.contextmanager
    def naming_refusals(self) -> Iterator[None]:
        """A loader's refusal (``ValueError``) of this entry's state, with the entry named."""
        try:
            yield
        except ValueError as exc:
            raise ValueError(f"{self.describe()}: {exc}") from exc


def process_rank(ranks: Any) -> tuple[int, int]:
    """This process's rank and world size: the default process group's when one is
    initialised (a loader built with ``distributed=False`` still runs on one of its ranks),
    else the loader's own ``ranks`` (0 of 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(ranks.rank), int(ranks.world_size)


def written_entry(loader_state: dict[str, Any], writer: tuple[int, int]) -> bytes:
    """The bytes of the entry of ``loader_state`` written by process ``writer`` (rank, world size)."""
    buffer = io.BytesIO()
    torch.save(ENTRY.write({"rank": writer[0], "world_size": writer[1], "loader": loader_state}), buffer)
    return buffer.getvalue()


def damaged(place: EntryPlace, exc: BaseException) -> ValueError:
    """The refusal of an entry that cannot be read at all."""
    return ValueError(
        f"{place.describe()} cannot be read ({type(exc).__name__}: {exc}): it was damaged after it was written "
        "(a truncated or corrupted file, or bytes that are no saved loader entry). Resume from another checkpoint"
    )


def read_entry(blob: Any, place: EntryPlace, expected_writer: tuple[int, int]) -> dict[str, Any]:
    """The loader's state in the entry ``blob``, verified, written by process ``expected_writer``
    (rank, world size: the one its key names); a ``ValueError`` naming the entry otherwise."""
    if not isinstance(blob, (bytes, bytearray)):
        raise ValueError(f"{place.describe()} is a {type(blob).__name__}, not a saved loader state")
    try:
        content = torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read is one refusal, naming the entry
        raise damaged(place, exc) from exc
    kind = state_kind(content)
    if kind in LOADER_KINDS:  # written by neuron_sift 0.8.0: the loader's state itself
        state = content
    elif kind == ENTRY.kind:
        with place.naming_refusals():
            entry = ENTRY.read(content)
            writer = (need_int(entry["rank"], "rank"), need_int(entry["world_size"], "world_size", 1))
        if writer != expected_writer:
            raise ValueError(
                f"{place.describe()} was written by process {writer[0]} of {writer[1]}, not by process "
                f"{expected_writer[0]} of {expected_writer[1]} whose key it is under: it is another process's state "
                "(was the checkpoint assembled by hand?). Each process resumes the state it wrote"
            )
        state = entry["loader"]
    else:
        raise ValueError(f"{place.describe()} holds {describe(content)}, not a saved loader state")
    if not isinstance(state, dict):
        raise ValueError(f"{place.describe()} holds {describe(state)}, not a loader state")
    with place.naming_refusals():
        verify_checksum(state, "the loader's state")
    return state
