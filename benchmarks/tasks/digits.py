"""``digits``: scikit-learn's bundled 8x8 digits and an MLP; the seconds-long smoke task."""

import torch
import torch.nn as nn

from benchmarks.tasks.data import DATA_SEED, Data


def digits_data(n_train: int, n_test: int) -> Data:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(DATA_SEED))
    x, y = x[perm], y[perm]
    n_train = min(n_train, len(y) - 1)
    n_test = min(n_test, len(y) - n_train)
    return Data(
        x[:n_train],
        y[:n_train],
        x[n_train : n_train + n_test],
        y[n_train : n_train + n_test],
        torch.zeros(n_train, dtype=torch.bool),
        10,
    )


def digits_model() -> nn.Module:
    """An MLP, 64 -> 128 -> 10."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
