"""Small stand-ins for a user's model, data and loss, shared by the loader tests."""

import torch
from torch.utils.data import DataLoader, Dataset

from neuron_sift import Loss, RelativeProbabilisticSiftConfig


class LossTableDataset(Dataset):
    """Sample i is ``(i, loss_i)``: the loss a perfect oracle model would give it."""

    def __init__(self, losses: torch.Tensor):
        self.losses = losses

    def __len__(self) -> int:
        return len(self.losses)

    def __getitem__(self, i):
        return torch.tensor(i), self.losses[i]


class OracleLoss(Loss):
    """Returns the stored loss of each sample (no __init__ of Loss called, as users do)."""

    def __init__(self):
        self.calls = 0

    def loss(self, model, transformed_batch, original_batch=None):
        self.calls += 1
        _ids, losses = original_batch
        return losses.to(next(model.parameters()).device).float()


class Classifier(torch.nn.Module):
    """A small real model: 10 features, 3 classes."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)


def tiny_model() -> torch.nn.Module:
    return torch.nn.Linear(1, 1)


def loss_table_loader(losses: torch.Tensor, batch_size: int, shuffle: bool = False, generator=None) -> DataLoader:
    return DataLoader(LossTableDataset(losses), batch_size=batch_size, shuffle=shuffle, generator=generator)


def make_config(beta=1.0, history=500, delay=0, mode="probabilistic", repeat=False, seed=0):
    """A per-batch config with the nested sift_delay settings flattened into arguments."""
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=history,
        loss_based_sift_config={"sift_config": {"sift_delay": delay, "repeat_delay_per_epoch": repeat}},
        selection_mode=mode,
        seed=seed,
    )
