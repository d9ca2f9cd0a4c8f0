"""Large-dataset sources for the format tests: a Hugging Face Arrow dataset on local disk,
a read counter over a map-style dataset, a sharded record set read by index, and MDS shards
written and counted with MosaicML Streaming itself.

``ShardedRecords`` is any ``IterableDataset`` that also reads by index, shaped as
Streaming's ``StreamingDataset`` is (it runs on every leg; ``user_data/test_mds.py`` runs the real
package where a leg installs it): samples live in shard files on disk, ``__iter__`` streams
them in order, ``__getitem__`` reads one by its global index (loading its shard on first
use), ``__len__`` is one rank's share of an epoch and ``size`` counts every sample,
``shuffle`` and ``epoch_size`` are its settings.

``write_mds`` and ``ShardReads`` import ``streaming`` when called, so this module imports
on a leg without it.
"""

import json
import os

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

WIDTH = 4


def features(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``WIDTH`` float32 features and a label learnable from the first one."""
    x = np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def arrow_dataset(path: str, n: int):
    """An Arrow dataset of ``n`` rows (``id``, ``x``, ``y``) written to ``path`` with
    ``save_to_disk`` and opened again with ``load_from_disk`` (memory-mapped, as a large one)."""
    import datasets

    x, y = features(n)
    datasets.Dataset.from_dict({"id": np.arange(n), "x": x, "y": y}).save_to_disk(path)
    return datasets.load_from_disk(path)


class CountingReads(Dataset):
    """A map-style dataset read through, recording every index the DataLoader reads: one
    ``__getitems__`` call per batch when the inner dataset has one (Hugging Face's does, and
    torch's DataLoader prefers it), else ``__getitem__``."""

    def __init__(self, inner):
        self.inner = inner
        self.reads: list[int] = []
        self.batched_calls = 0

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        self.reads.append(int(i))
        return self.inner[i]

    def __getitems__(self, ids):
        self.reads.extend(int(i) for i in ids)
        self.batched_calls += 1
        return self.inner.__getitems__(ids)


def write_shards(root: str, n: int, shard_size: int = 16) -> str:
    """``n`` samples (``id``, ``x``, ``y``) in shard files of ``shard_size`` under ``root``,
    with an index of the shard size and count (as an MDS folder has its index.json)."""
    x, y = features(n)
    os.makedirs(root, exist_ok=True)
    for s, start in enumerate(range(0, n, shard_size)):
        part = slice(start, min(n, start + shard_size))
        np.savez(os.path.join(root, f"shard.{s:05d}.npz"), id=np.arange(n)[part], x=x[part], y=y[part])
    with open(os.path.join(root, "index.json"), "w", encoding="utf-8") as f:
        json.dump({"samples": n, "shard_size": shard_size}, f)
    return root


class ShardedRecords(IterableDataset):
    """The samples of ``write_shards(root, ...)``; see the module docstring."""

    def __init__(self, root: str, shuffle: bool = True, world_size: int = 1, epoch_size: int | None = None):
        with open(os.path.join(root, "index.json"), encoding="utf-8") as f:
            index = json.load(f)
        n, self.shard_size = index["samples"], index["shard_size"]
        self.paths = [os.path.join(root, f"shard.{s:05d}.npz") for s in range(-(-n // self.shard_size))]
        self.n = n
        self.shuffle = shuffle
        self.epoch_size = n if epoch_size is None else epoch_size
        self.world_size = world_size
        self.reads: list[int] = []
        self._shards: dict[int, dict[str, np.ndarray]] = {}

    @property
    def size(self) -> int:
        return self.n

    def __len__(self) -> int:
        return -(-self.epoch_size // self.world_size)

    def _shard(self, s: int) -> dict[str, np.ndarray]:
        if s not in self._shards:
            with np.load(self.paths[s]) as f:
                self._shards[s] = {k: f[k] for k in f.files}
        return self._shards[s]

    def _sample(self, i: int) -> dict[str, torch.Tensor]:
        self.reads.append(int(i))  # every read, by index or by iteration
        shard, j = self._shard(i // self.shard_size), i % self.shard_size
        return {k: torch.as_tensor(v[j]) for k, v in shard.items()}

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self._sample(i)

    def __iter__(self):
        for i in range(self.n):
            yield self._sample(i)


class Stream(IterableDataset):
    """A pure stream: samples in order, no random access, no length."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        x, y = features(self.n)
        for i in range(self.n):
            yield {"id": torch.tensor(i), "x": torch.from_numpy(x[i]), "y": torch.tensor(y[i])}


class SizedStream(Stream):
    """A pure stream that knows its length (as a WebDataset given one): still no random access."""

    def __len__(self) -> int:
        return self.n


# -- MosaicML Streaming (MDS shards), imported when used ------------------------------------

MDS_COLUMNS = {"id": "int", "x": f"ndarray:float32:{WIDTH}", "y": "int"}


def write_mds(out: str, n: int, size_limit: int = 300, compression: str | None = "zstd") -> str:
    """``n`` samples (``id``, ``x``, ``y``) written with ``streaming.MDSWriter`` to ``out``: about
    two samples a shard at the default ``size_limit``, so a sifted epoch leaves whole shards
    out. Compressed, the folder holds only the ``.mds.zstd`` files until a sample of a shard
    is read: Streaming then decompresses that shard to its raw ``.mds`` file."""
    from streaming import MDSWriter

    x, y = features(n)
    with MDSWriter(out=out, columns=MDS_COLUMNS, compression=compression, size_limit=size_limit) as writer:
        for i in range(n):
            writer.write({"id": i, "x": x[i], "y": int(y[i])})
    return out


def raw_shards(local: str) -> set[str]:
    """The raw (decompressed) shard files in ``local``: the shards Streaming has opened."""
    return {name for name in os.listdir(local) if name.endswith(".mds")}


class ShardReads:
    """Every sample read out of an MDS shard file, in any process (DataLoader workers, ranks):
    ``MDSReader.get_sample_data`` opens the shard's raw file once per sample read, and the
    patch appends the shard's file name and the sample's place in it to ``path``, one line
    a read (an appended short line is one write). Streaming tries the raw file first and
    decompresses the shard when it is missing: that failed open reads nothing and is not
    logged. ``install`` patches the class, in this
    process and in the workers it forks; ``uninstall`` puts it back."""

    def __init__(self, path: str):
        self.path = path
        self._original = None

    def install(self) -> "ShardReads":
        from streaming.base.format.mds.reader import MDSReader

        original = self._original = MDSReader.get_sample_data
        path = self.path

        def logged(reader, idx):
            data = original(reader, idx)  # raises FileNotFoundError before a shard is decompressed: no read
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{reader.raw_data.basename} {int(idx)}\n")
            return data

        MDSReader.get_sample_data = logged
        return self

    def uninstall(self) -> None:
        from streaming.base.format.mds.reader import MDSReader

        if self._original is not None:
            MDSReader.get_sample_data = self._original
            self._original = None

    def clear(self) -> None:
        open(self.path, "w", encoding="utf-8").close()

    def entries(self) -> list[tuple[str, int]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [(name, int(i)) for name, i in (line.split() for line in f)]

    def ids(self, ds) -> list[int]:
        """The global sample ids read, in the order read, by ``ds``'s shard offsets."""
        offsets = shard_offsets(ds)
        return [offsets[name] + i for name, i in self.entries()]

    def shards(self) -> set[str]:
        return {name for name, _ in self.entries()}


def shard_offsets(ds) -> dict[str, int]:
    """Each raw shard file's first global sample id in ``StreamingDataset`` ``ds``."""
    return {sh.raw_data.basename: int(o) for sh, o in zip(ds.shards, ds.sample_offset_per_shard)}


def shards_of(ds, ids) -> set[str]:
    """The raw shard files holding samples ``ids`` of ``ds``."""
    starts = sorted((o, name) for name, o in shard_offsets(ds).items())
    firsts = np.array([o for o, _ in starts])
    return {starts[int(np.searchsorted(firsts, i, side="right")) - 1][1] for i in ids}
