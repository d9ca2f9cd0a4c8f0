"""What every task's data is: its tensors, and the one seed that makes it (the same dataset for every run seed)."""

from dataclasses import dataclass

import torch

DATA_SEED = 42  # the dataset (its flipped labels, its duplicates) is the same for every run seed


@dataclass
class Data:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    mislabeled: torch.Tensor  # [n_train] bool: training label was flipped
    n_classes: int
