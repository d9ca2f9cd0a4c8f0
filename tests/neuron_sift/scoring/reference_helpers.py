"""A tiny dataset, reference model and loss for the reference-table tests (in-process,
under torchrun and on torch-xla's CPU device): each sample carries its id, so the loss
records which samples each call scored and the shapes the model saw."""

import torch
from torch.utils.data import DataLoader, Dataset

from neuron_sift.loss.abstract_sift_loss_module import Loss

FEATURES = 6
CLASSES = 3


class IdData(Dataset):
    """``n`` samples ``(x, y, id)``, the same for every ``n`` up to its size (a seeded draw)."""

    def __init__(self, n: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def reference_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(16, CLASSES)
    )


class Preempted(Exception):
    """The job stopped in the middle of the pass."""


class RecordingLoss(Loss):
    """Cross-entropy per sample on the model's device; records each call's ids, input shape
    and modes, and raises at call ``fail_at`` (counted from 1) to stand in for a preemption."""

    def __init__(self, fail_at: int | None = None, nan_at: int | None = None):
        self.fail_at = fail_at
        self.nan_at = nan_at  # a sample id whose loss is NaN
        self.ids: list[list[int]] = []
        self.shapes: list[tuple[int, ...]] = []
        self.grad: list[bool] = []
        self.training: list[bool] = []

    def loss(self, model, transformed_batch, original_batch=None):
        if self.fail_at is not None and len(self.ids) + 1 == self.fail_at:
            raise Preempted(f"preempted at call {self.fail_at}")
        x, y, ids = original_batch
        self.ids.append([int(i) for i in ids])
        self.shapes.append(tuple(x.shape))
        self.grad.append(torch.is_grad_enabled())
        self.training.append(any(m.training for m in model.modules()))
        device = next(model.parameters()).device
        losses = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device), reduction="none")
        if self.nan_at is not None:
            losses = torch.where(ids.to(device) == self.nan_at, torch.full_like(losses, float("nan")), losses)
        return losses

    @property
    def calls(self) -> int:
        return len(self.ids)


def direct_losses(model: torch.nn.Module, dataset, batch_size: int) -> torch.Tensor:
    """The same computation written out: batches of ``batch_size`` in id order, eval mode, no gradients."""
    model.eval()
    out = []
    with torch.no_grad():
        for x, y, _ids in DataLoader(dataset, batch_size=batch_size):
            out.append(torch.nn.functional.cross_entropy(model(x), y, reduction="none"))
    model.train()
    return torch.cat(out)
