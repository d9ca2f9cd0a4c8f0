"""Runs a small training loop on torch-xla's CPU device in a fresh process and prints counts.

Compilation counts are process-global (a graph compiled by an earlier test is a cache
hit later), so the tests that assert them run this script in a new process each time.
Usage: python xla_probe.py --mode fixed|probabilistic|plain [--epochs 4] [--source mp]
Prints one JSON object: per-epoch compiles / host reads / batches, fallback counters and
the loader's counts.
"""

import argparse
import json

import torch
import torch_xla
import torch_xla.debug.metrics as met
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader


def metric_count(name: str) -> int:
    d = met.metric_data(name)
    return 0 if d is None else d[0]


class CELoss:
    def __init__(self):
        self.ce = torch.nn.CrossEntropyLoss(reduction="none")

    def loss(self, model, transformed_batch, original_batch=None):
        device = next(model.parameters()).device
        x, y = [t.to(device) for t in original_batch]
        return self.ce(model(x), y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["fixed", "probabilistic", "plain"], required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--source", choices=["dataloader", "mp"], default="dataloader")
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch_xla.device()
    x = torch.randn(args.samples, 10)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    source = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    if args.source == "mp":
        import torch_xla.distributed.parallel_loader as pl

        source = pl.MpDeviceLoader(source, device)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)).to(device)
    if args.mode == "plain":
        loader = source
    else:
        cfg = RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=128,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            selection_mode=args.mode,
            seed=0,
        )
        loader = SiftingDataloader(sift_config=cfg, orig_dataloader=source, loss_impl=CELoss(), model=model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    met.clear_all()
    epochs = []
    for _ in range(args.epochs):
        n = 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch_xla.sync()
            n += 1
        epochs.append(
            {"compiles": metric_count("CompileTime"), "reads": metric_count("TransferFromDeviceTime"), "batches": n}
        )
    out = {
        "epochs": epochs,
        "fallbacks": [k for k in met.counter_names() if k.startswith("aten::")],
        "counts": loader.counts.as_dict() if args.mode != "plain" else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
