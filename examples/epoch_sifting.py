#!/usr/bin/env python
"""Epoch-level sifting in a plain PyTorch loop: the three-line migration.

    python examples/epoch_sifting.py [--epochs 8] [--kept-share 0.5]

A small classifier on generated data. The three lines marked "neuron_sift" are the whole
change from the plain loop: wrap the DataLoader, compute the loss per sample, and pass it
through ``weighted_loss``. The learning-rate schedule is sized by ``planned_steps()``
(exact with a budget).
"""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader


def main(argv=None) -> float:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--kept-share", type=float, default=0.5)
    p.add_argument("--samples", type=int, default=4000)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    x = torch.randn(args.samples, 20)
    y = (x[:, :5].sum(1) > 0).long() + (x[:, 5] > 1).long()
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    train_loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    train_loader = EpochSiftingDataloader(  # neuron_sift (1/3)
        EpochSiftConfig(kept_share=args.kept_share), train_loader, num_epochs=args.epochs
    )
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=train_loader.planned_steps())

    for epoch in range(args.epochs):
        for xb, yb in train_loader:
            per_sample = F.cross_entropy(model(xb), yb, reduction="none")  # neuron_sift (2/3)
            loss = train_loader.weighted_loss(per_sample)  # neuron_sift (3/3)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        m = train_loader.metrics()
        print(
            f"epoch {epoch}: {m['epoch_kind']:7s} kept share {m['observed_kept_share']:.2f}, mean weight "
            f"{m['mean_weight']:.2f}, loss {loss.item():.3f}"
        )
    acc = (model(x).argmax(1) == y).float().mean().item()
    print(
        f"training accuracy {acc:.3f}; {train_loader.metrics()['batches_recorded']} steps "
        f"(planned {sum(h['batches'] for h in train_loader.history)})"
    )
    return acc


if __name__ == "__main__":
    main()
