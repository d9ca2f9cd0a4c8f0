"""Large-dataset sources for the format tests: a Hugging Face Arrow dataset on local disk,
a read counter over a map-style dataset, and a sharded record set read by index.

``ShardedRecords`` stands in for MosaicML Streaming's ``StreamingDataset`` (whose releases
pin ``transformers<5`` and ``numpy<2.2``, so it cannot join the test extra): samples live
in shard files on disk, ``__iter__`` streams them in order, ``__getitem__`` reads one by
its global index (loading its shard on first use), ``__len__`` is one rank's share of an
epoch and ``size`` counts every sample, ``shuffle`` and ``epoch_size`` are its settings.
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
