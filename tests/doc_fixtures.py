"""Set-up for the documentation's code examples that use names from the reader's own script.

A block preceded by ``<!-- setup: NAME (...) -->`` in README.md or docs/*.md runs after the
function ``NAME`` below; the names it returns stand in for the reader's model, dataset and
loaders (small and synthetic, so every example runs in seconds). tests/test_doc_examples.py
runs them.
"""

import types
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class _SeedStyleModel(torch.nn.Module):
    """A tiny text classifier called the way the smart_sifting seeds call theirs: ``model(batch)``
    with the list batch ``[input_ids, attention_mask, labels]``, returning an object with
    ``.logits``."""

    def __init__(self, vocab: int = 100, classes: int = 2):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(vocab, classes)

    def forward(self, batch):
        input_ids, attention_mask, _labels = batch
        return types.SimpleNamespace(logits=self.embed(input_ids, per_sample_weights=None))


def seed_stand_ins() -> dict[str, Any]:
    """``train_dataset``, ``batch_size`` and ``model`` for the migration example."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (96, 8), generator=g)
    labels = (ids[:, 0] >= 50).long()
    return {
        "train_dataset": TensorDataset(ids, torch.ones_like(ids), labels),
        "batch_size": 8,
        "model": _SeedStyleModel(),
    }


def checkpoint_stand_ins() -> dict[str, Any]:
    """``model``, ``sampler``, ``train_dataloader`` (a sifting loader), ``start_epoch`` and
    ``epochs`` for the checkpoint example."""
    from neuron_sift import Loss, RelativeProbabilisticSiftConfig, SiftingDataloader

    class SiftLoss(Loss):
        def loss(self, model, transformed_batch, original_batch=None):
            x, y = original_batch
            return torch.nn.functional.cross_entropy(model(x), y, reduction="none")

    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(128, 10, generator=g), torch.randint(0, 3, (128,), generator=g))
    model = torch.nn.Linear(10, 3)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
    train_dataloader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1,
            loss_history_length=64,
            selection_mode="fixed",
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
        ),
        orig_dataloader=DataLoader(dataset, batch_size=16, sampler=sampler),
        loss_impl=SiftLoss(),
        model=model,
    )
    return {
        "torch": torch,
        "model": model,
        "sampler": sampler,
        "train_dataloader": train_dataloader,
        "start_epoch": 0,
        "epochs": 2,
    }


def epoch_stand_ins() -> dict[str, Any]:
    """``DataLoader``, ``F``, ``train_ds``, ``B``, ``E``, ``model`` and ``opt`` for the
    three-line migration of a plain loop to epoch-level sifting."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    return {
        "DataLoader": DataLoader,
        "F": torch.nn.functional,
        "train_ds": TensorDataset(x, y),
        "B": 32,
        "E": 3,
        "model": model,
        "opt": torch.optim.Adam(model.parameters(), lr=3e-3),
    }
