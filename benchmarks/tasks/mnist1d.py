"""MNIST-1D, the main job's data (``mnist1d``, ``mnist1d-noisy``, ``mnist1d-long``), its redundant
variant (``mnist1d-redundant``: most samples near-copies of a few) and the 1-D CNN they train
(the tasks are described in ``registry.py``)."""

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from benchmarks.tasks.data import DATA_SEED, Data

# mnist1d-redundant: the share of distinct samples, the duplicated pool, the jitter
REDUNDANT_DISTINCT = 0.25
REDUNDANT_POOL = 0.025  # 1,000 of 40,000: each duplicated 30 times
REDUNDANT_JITTER = 0.05


def mnist1d_data(n_train: int, n_test: int, cache: Path | None) -> Data:
    """MNIST-1D from ``mnist1d.data.make_dataset`` (generated locally: never ``get_dataset``,
    which downloads a pickle). Cached as .npz under ``cache`` (generating it is slow)."""
    n = n_train + n_test
    path = cache / f"mnist1d_n{n}_seed{DATA_SEED}.npz" if cache else None
    if path is not None and path.is_file():
        z = np.load(path)
        x, y, xt, yt = z["x"], z["y"], z["x_test"], z["y_test"]
    else:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = n
        args.train_split = n_train / n
        args.seed = DATA_SEED
        state = np.random.get_state()
        d = make_dataset(args)  # seeds numpy's and random's global generators
        np.random.set_state(state)
        x, y, xt, yt = d["x"], d["y"], d["x_test"], d["y_test"]
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, x=x, y=y, x_test=xt, y_test=yt)
    return Data(
        torch.tensor(x[:n_train], dtype=torch.float32),
        torch.tensor(y[:n_train], dtype=torch.int64),
        torch.tensor(xt[:n_test], dtype=torch.float32),
        torch.tensor(yt[:n_test], dtype=torch.int64),
        torch.zeros(min(n_train, len(y)), dtype=torch.bool),
        10,
    )


def make_redundant(data: Data, seed: int = DATA_SEED) -> Data:
    """Keep the first ``REDUNDANT_DISTINCT`` share of the training samples distinct; every
    other training sample becomes a jittered copy of one of a pool of ``REDUNDANT_POOL`` x n
    of the distinct ones (each pool sample duplicated equally often). Labels follow their
    originals; the sample count, the test set and the epochs are those of ``mnist1d``, so
    ``full`` costs the same as there."""
    n = data.x_train.shape[0]
    n_distinct = max(1, round(REDUNDANT_DISTINCT * n))
    pool = max(1, min(n_distinct, round(REDUNDANT_POOL * n)))
    g = torch.Generator().manual_seed(seed + 2)
    pool_ids = torch.randperm(n_distinct, generator=g)[:pool]
    src = pool_ids[torch.arange(n - n_distinct) % pool]
    src = src[torch.randperm(src.numel(), generator=g)]
    ids = torch.cat([torch.arange(n_distinct), src])
    x = data.x_train[ids].clone()
    x[n_distinct:] += REDUNDANT_JITTER * torch.randn(x[n_distinct:].shape, generator=g)
    order = torch.randperm(n, generator=g)  # duplicates spread through the data
    return Data(
        x[order], data.y_train[ids][order], data.x_test, data.y_test, torch.zeros(n, dtype=torch.bool), data.n_classes
    )


class CNN1D(nn.Module):
    """The default model: three 1-D convolutions (32 channels) and a linear head, 40 -> 10."""

    def __init__(self, length: int = 40, channels: int = 32, n_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, channels, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(channels * ((length + 3) // 4), n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.unsqueeze(1))
