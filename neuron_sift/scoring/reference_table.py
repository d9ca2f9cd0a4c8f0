"""Reference losses: one loss per dataset sample from a reference model, keyed by sample id.

Why a table on disk: excess loss (RHO-LOSS, Mindermann et al. 2022) needs, for every
training sample, the loss of a model trained on held-out clean data. That model's scores do
not change while the learner trains, so they are computed once per dataset
(``score_dataset``) and read by the loaders at every batch. A sample id is the index ``i``
of ``dataset[i]``; the table is tied to its dataset by size and by a fingerprint of a few
samples, so a table written for another dataset is refused instead of silently misread.
The layout is described in ``reference_files.py``.
"""

import contextlib
import hashlib
import random
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from neuron_sift.scoring import reference_files as files

SAMPLED = 16  # samples read by dataset_fingerprint


def dataset_size(dataset: Any, who: str = "dataset_fingerprint") -> int:
    """``len(dataset)`` of a map-style dataset (``__len__`` and ``__getitem__``); TypeError otherwise."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"{who} needs a map-style dataset (with __len__ and __getitem__, read as dataset[i]), got "
            f"{type(dataset).__name__}; sample ids are indices into it, which an iterable dataset does not have"
        )
    try:
        return len(dataset)
    except TypeError as exc:
        raise TypeError(f"{who} needs a dataset with __len__, got {type(dataset).__name__} ({exc})") from exc


def _put(h: Any, tag: bytes, payload: bytes) -> None:
    h.update(tag + struct.pack("<Q", len(payload)) + payload)


def _feed(h: Any, value: Any) -> None:
    """Serialise ``value`` into ``h``: every part framed by a tag and a length, so two
    different samples never write the same bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        t = (t.to_dense() if t.layout != torch.strided else t).resolve_conj().resolve_neg().contiguous()
        _put(h, b"tensor", f"{t.dtype}{tuple(t.shape)}".encode())
        _put(h, b"data", t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray) and value.dtype != object:
        _put(h, b"ndarray", f"{value.dtype.str}{value.shape}".encode())
        _put(h, b"data", np.ascontiguousarray(value).tobytes())
    elif isinstance(value, np.ndarray):  # object arrays hold pointers: their elements instead
        _put(h, b"objects", f"{value.shape}".encode())
        for item in value.reshape(-1):
            _feed(h, item)
    elif isinstance(value, np.generic):
        _put(h, b"scalar:" + value.dtype.str.encode(), value.tobytes())
    elif value is None or isinstance(value, (bool, int, str, bytes)):
        _put(h, type(value).__name__.encode(), value if isinstance(value, bytes) else repr(value).encode())
    elif isinstance(value, float):
        _put(h, b"float", value.hex().encode())
    elif isinstance(value, (tuple, list)):
        _put(h, b"tuple" if isinstance(value, tuple) else b"list", struct.pack("<Q", len(value)))
        for item in value:
            _feed(h, item)
    elif isinstance(value, Mapping):
        items = []
        for key, item in value.items():
            kh = hashlib.sha256()
            _feed(kh, key)
            items.append((kh.digest(), item))
        _put(h, b"dict", struct.pack("<Q", len(items)))
        for key_digest, item in sorted(items, key=lambda kv: kv[0]):  # whatever the insertion order
            _put(h, b"key", key_digest)
            _feed(h, item)
    else:
        _put(h, b"other", f"{type(value).__module__}.{type(value).__qualname__}".encode())


def fingerprint_ids(n: int) -> list[int]:
    """The ids ``dataset_fingerprint`` reads: ``SAMPLED`` evenly spaced, 0 and ``n - 1`` included."""
    if n <= SAMPLED:
        return list(range(n))
    return [k * (n - 1) // (SAMPLED - 1) for k in range(SAMPLED)]


def dataset_fingerprint(dataset: Any) -> str:
    """A sha256 hex digest of a map-style dataset's size and of up to 16 of its samples.

    Why a sample, not every one: the fingerprint is computed by every loader that reads a
    reference table, so it must cost a few reads whatever the dataset's size; it catches a
    table used with another dataset, a reordered or resized one, not an edit of one sample
    between the ones read. The samples read are at evenly spaced ids (``0`` and ``n - 1``
    included). Each is serialised recursively: tuples, lists and dicts (keys in a fixed
    order, whatever the insertion order) by their items; torch tensors and NumPy arrays by
    dtype, shape and the bytes of a contiguous CPU copy; ``bool``, ``int``, ``float``,
    ``str``, ``bytes`` and ``None`` by type and value. Anything else (a PIL image, an object
    of your own) counts by its type's qualified name only, so a dataset of such samples is
    fingerprinted by its size and types alone: return tensors or arrays to have it count.
    The reads run under fixed seeds (``_seeded_reads``), so random augmentation in
    ``__getitem__`` (drawn from torch's, NumPy's or Python's global generator) does not change
    the fingerprint.

    Raises:
        TypeError: ``dataset`` is not map-style (an ``IterableDataset``, no ``__len__``).
    """
    n = dataset_size(dataset)
    h = hashlib.sha256()
    _put(h, b"len", struct.pack("<Q", n))
    with _seeded_reads():
        for i in fingerprint_ids(n):
            _put(h, b"id", struct.pack("<Q", i))
            _feed(h, dataset[i])
    return h.hexdigest()


@contextlib.contextmanager
def _seeded_reads() -> Iterator[None]:
    """The fingerprint's reads under fixed seeds of torch's, NumPy's and Python's global
    generators, each restored afterwards: a dataset that augments its samples at random
    gives the same fingerprint at every read, and the user's run draws what it would have."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def as_ids(ids: Any, name: str = "ids") -> np.ndarray:
    """``ids`` (a 1-D integer tensor, array or sequence) as an int64 NumPy array; TypeError/ValueError otherwise."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    elif not isinstance(ids, np.ndarray):
        if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
            raise TypeError(f"{name} must be a 1-D integer tensor, array or sequence, got {type(ids).__name__}")
        ids = np.asarray(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must hold integer sample ids, got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one sample id per entry), got shape {list(ids.shape)}")
    return ids.astype(np.int64, copy=False)


class ReferenceTable:
    """A reference model's loss for each sample id ``0 .. n-1`` of one dataset (NaN: not scored).

    Made by ``score_dataset`` (or ``from_losses``) and read with ``load``, not built with the
    constructor (which takes the shards as stored); the loaders ask it for the losses of a
    batch's ids with ``lookup``. A loaded table keeps its shards memory-
    mapped, so a table larger than memory is read only where it is looked up.

    Attributes:
        n: the dataset's size.
        fingerprint: ``dataset_fingerprint`` of the dataset it was scored on (None: unknown).
        description: free text (which reference model, on which data).
        path: the folder it was loaded from or saved to (None: in memory only).
        covered: how many ids have a loss.
        ids_sha256: the digest of the scored ids (None: every id is scored).
    """

    def __init__(
        self,
        shards: list[torch.Tensor],
        n: int,
        covered: int,
        fingerprint: str | None,
        description: str,
        ids_sha256: str | None,
        path: Path | None,
    ):
        self._shards = shards
        self.n = n
        self.covered = covered
        self.fingerprint = fingerprint
        self.description = description
        self.ids_sha256 = ids_sha256
        self.path = path

    def __repr__(self) -> str:
        return f"ReferenceTable(n={self.n}, covered={self.covered}, at {self._where()})"

    def _where(self) -> str:
        return str(self.path) if self.path is not None else "in-memory table"

    @classmethod
    def from_losses(cls, losses: Any, *, fingerprint: str | None = None, description: str = "") -> "ReferenceTable":
        """A table in memory from one loss per id (a 1-D float tensor or array of length n, NaN: not covered)."""
        if isinstance(losses, np.ndarray):
            losses = torch.from_numpy(losses)
        if not isinstance(losses, torch.Tensor):
            raise TypeError(f"losses must be a 1-D float tensor or NumPy array, got {type(losses).__name__}")
        if not losses.dtype.is_floating_point:
            raise TypeError(f"losses must be floating point (NaN marks an id not covered), got dtype {losses.dtype}")
        if losses.ndim != 1 or losses.shape[0] == 0:
            raise ValueError(f"losses must be 1-D with one loss per sample id, got shape {list(losses.shape)}")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise TypeError(f"fingerprint must be a str (dataset_fingerprint's) or None, got {type(fingerprint)}")
        if not isinstance(description, str):
            raise TypeError(f"description must be a str, got {type(description).__name__}")
        values = losses.detach().cpu().to(torch.float32).clone()
        infinite = torch.isinf(values).nonzero()
        if infinite.numel():
            i = int(infinite[0, 0])
            raise ValueError(
                f"losses[{i}] is {float(values[i])} (as float32): a reference table holds finite losses, NaN marking "
                "an id not covered; fix the loss or mark the sample NaN"
            )
        scored = (~torch.isnan(values)).nonzero()[:, 0].numpy()
        digest = files.ids_sha256(scored, values.shape[0])
        return cls([values], int(values.shape[0]), int(scored.shape[0]), fingerprint, description, digest, None)

    @classmethod
    def load(cls, path: str | Path) -> "ReferenceTable":
        """The table in folder ``path`` (as ``score_dataset`` or ``save`` wrote it).

        Raises:
            ValueError: no such folder, no manifest, another format or version, a shard
                missing, damaged or disagreeing with the manifest, or a table not finished
                (the message names the folder and what to do).
        """
        folder = Path(path)
        head = files.read_manifest(folder)
        shards, done = [], 0
        for rank in range(head["shards"]):
            losses, shard_done = files.read_shard(folder, head, rank)
            shards.append(losses)
            done += shard_done
        if done != head["covered"]:
            raise ValueError(
                f"cannot load the reference table at {folder}: it is incomplete, {done} of {head['covered']} "
                f"samples scored; {files.RESCORE} to finish it"
            )
        return cls(
            shards, head["n"], head["covered"], head["fingerprint"], head["description"], head["ids_sha256"], folder
        )

    def save(self, path: str | Path) -> None:
        """Write the table into folder ``path`` (created; it must be new or empty) as one shard.

        Each file is written to a temporary name and moved into place, so a reader never sees half a file.
        """
        folder = Path(path)
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise ValueError(
                f"cannot save a reference table to {folder}: it exists and is not an empty folder; "
                "save to a new path or remove it"
            )
        folder.mkdir(parents=True, exist_ok=True)
        files.write_shard(folder, self.n, 1, 0, self.losses(), self.covered)
        files.write_manifest(
            folder,
            files.manifest(self.n, 1, self.fingerprint, self.description, self.ids_sha256, self.covered),
        )
        self.path = folder

    def check_dataset(self, dataset: Any, who: str = "the loader") -> None:
        """Refuse ``dataset`` when it is not the one this table was scored on (size, fingerprint)."""
        size = dataset_size(dataset, who)
        if size != self.n:
            raise ValueError(
                f"{who}: the reference table ({self._where()}) has losses for {self.n} samples, but the dataset has "
                f"{size}: a reference table from another dataset; score this dataset with score_dataset"
            )
        if self.fingerprint is not None:
            mine = dataset_fingerprint(dataset)
            if mine != self.fingerprint:
                raise ValueError(
                    f"{who}: a reference table from another dataset: the table ({self._where()}) was scored on a "
                    f"dataset with fingerprint {self.fingerprint}, this dataset's is {mine} (same size {size}, other "
                    "samples or order); score this dataset with score_dataset"
                )

    def lookup(self, ids: Any) -> torch.Tensor:
        """The losses of ``ids`` (1-D, in their order) as a float32 CPU tensor.

        Raises:
            ValueError: an id outside ``[0, n)`` or without a loss (the first one is named).
        """
        ids = as_ids(ids)
        outside = (ids < 0) | (ids >= self.n)
        if outside.any():
            bad = int(ids[outside.argmax()])
            raise ValueError(
                f"sample id {bad} is outside [0, {self.n}) of the reference table ({self._where()}); "
                "look up ids of the dataset it was scored on"
            )
        width = len(self._shards)
        out = torch.empty(ids.shape[0], dtype=torch.float32)
        if width == 1:
            out.copy_(self._shards[0][torch.from_numpy(ids)])
        else:
            for rank in np.unique(ids % width).tolist():
                rows = np.flatnonzero(ids % width == rank)
                out[torch.from_numpy(rows)] = self._shards[rank][torch.from_numpy(ids[rows] // width)]
        missing = torch.isnan(out)
        if missing.any():
            bad = int(ids[int(missing.nonzero()[0, 0])])
            raise ValueError(
                f"sample id {bad} has no loss in the reference table ({self._where()}, {self.covered} of {self.n} "
                "ids scored); score it with score_dataset, or leave it out of the data you train on"
            )
        return out

    def losses(self) -> torch.Tensor:
        """Every id's loss as a ``[n]`` float32 CPU tensor, NaN where none (assembled from the shards)."""
        width = len(self._shards)
        if width == 1:
            return self._shards[0].clone()
        out = torch.empty(self.n, dtype=torch.float32)
        for rank, shard in enumerate(self._shards):
            out[rank::width] = shard
        return out


def as_reference_table(value: Any) -> ReferenceTable | None:
    """A loader's ``reference`` argument as a table: a ``ReferenceTable``, a folder written by
    ``score_dataset`` (loaded), or None."""
    if value is None or isinstance(value, ReferenceTable):
        return value
    if isinstance(value, str) or hasattr(value, "__fspath__"):
        return ReferenceTable.load(value)
    raise TypeError(
        f"reference must be a ReferenceTable, a folder written by score_dataset, or None; got {type(value).__name__}"
    )
