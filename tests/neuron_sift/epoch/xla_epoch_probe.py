"""Runs an epoch-sifted training loop on torch-xla's CPU device in a fresh process; prints counts.

Compilation counts are process-global, so the test runs this script in a new process.
Usage: python xla_epoch_probe.py [--epochs 5] [--source dataloader|mp|plain] [--budget 0.4]
Prints one JSON object: per-epoch compiles, host reads (TransferFromDeviceTime samples),
batches and the epoch's kind; aten fallback counters; where the tables live.
"""

import argparse
import json

import torch
import torch_xla
import torch_xla.debug.metrics as met
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader


def metric_count(name: str) -> int:
    d = met.metric_data(name)
    return 0 if d is None else d[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--source", choices=["dataloader", "mp", "plain"], default="dataloader")
    p.add_argument("--budget", type=float, default=None)
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
    loader = source
    if args.source != "plain":
        cfg = {"seed": 0, "anneal_fraction": 0.2}
        if args.budget is not None:
            cfg["kept_share"] = args.budget
        loader = EpochSiftingDataloader(cfg, source, num_epochs=args.epochs)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    met.clear_all()
    epochs = []
    for _ in range(args.epochs):
        n = 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            per_sample = torch.nn.functional.cross_entropy(model(xb), yb, reduction="none")
            loss = loader.weighted_loss(per_sample) if args.source != "plain" else per_sample.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch_xla.sync()
            n += 1
        epochs.append(
            {
                "compiles": metric_count("CompileTime"),
                "reads": metric_count("TransferFromDeviceTime"),
                "batches": n,
                "kind": loader.plan.kind if args.source != "plain" else "plain",
            }
        )
    out = {
        "epochs": epochs,
        "fallbacks": [k for k in met.counter_names() if k.startswith("aten::")],
    }
    if args.source != "plain":
        out["table_device"] = str(loader.tables._dev_scores.device)
        out["metrics"] = {k: v for k, v in loader.metrics().items() if k != "epochs"}
        out["kept"] = [h["kept"] for h in loader.history]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
