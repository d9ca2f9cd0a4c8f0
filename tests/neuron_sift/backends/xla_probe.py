"""Runs sifting on torch-xla's CPU device in a fresh process and prints torch-xla's counts as
one JSON line; ``run_probe`` launches it. Used by both modes' XLA tests and the Neuron-limits
test.

Why a fresh process: compilation counts are process-global (a graph compiled by an earlier
test is a cache hit later), so a test that asserts them needs a process of its own.

``--mode per-batch|epoch|plain``: the same training loop over the same data with a
``SiftingDataloader`` (``--selection fixed|probabilistic``), an ``EpochSiftingDataloader``
(``--budget``: its kept_share) or the plain DataLoader; ``--source mp`` wraps the DataLoader
in torch-xla's ``MpDeviceLoader``. Prints per-epoch compiles (``CompileTime`` samples), host
reads (``TransferFromDeviceTime`` samples), batches and the epoch's kind, the aten fallback
counters, and the loader's counts (per-batch) or tables, metrics and kept samples (epoch).

``--mode shapes``: the per-batch engine over the shapes that matter for Neuron's limits, both
selection modes, batch sizes and histories up to 32768, a short last batch every epoch, two
epochs; no training. Run with ``XLA_FLAGS=--xla_dump_to=DIR`` to dump every graph as HLO
text; prints the op counters and the shapes.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHAPES = [(64, 128), (256, 4096), (32, 32768), (256, 32768)]  # (B, H) of --mode shapes


def run_probe(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> dict:
    """This script's JSON line from a fresh process on torch-xla's CPU device."""
    full_env = dict(os.environ, PJRT_DEVICE="CPU", PYTHONPATH=ROOT, **(env or {}))
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=ROOT, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class CELoss:
    def __init__(self):
        self.ce = torch.nn.CrossEntropyLoss(reduction="none")

    def loss(self, model, transformed_batch, original_batch=None):
        device = next(model.parameters()).device
        x, y = [t.to(device) for t in original_batch]
        return self.ce(model(x), y)


class ColumnLoss:
    def loss(self, model, transformed_batch, original_batch=None):
        return original_batch[0][:, 0].abs()


def metric_count(name: str) -> int:
    import torch_xla.debug.metrics as met

    d = met.metric_data(name)
    return 0 if d is None else d[0]


def sift_config(selection: str, history: int):
    from neuron_sift import RelativeProbabilisticSiftConfig

    return RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=history,
        loss_based_sift_config={"sift_config": {"sift_delay": 0}},
        selection_mode=selection,
        seed=0,
    )


def training(args) -> dict:
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch.utils.data import DataLoader, TensorDataset

    from neuron_sift import EpochSiftingDataloader, SiftingDataloader

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
    if args.mode == "per-batch":
        cfg = sift_config(args.selection, 128)
        loader = SiftingDataloader(sift_config=cfg, orig_dataloader=source, loss_impl=CELoss(), model=model)
    elif args.mode == "epoch":
        epoch_cfg = {"seed": 0, "anneal_fraction": 0.2, "score_table": args.score_table, "start_rank_correlation": None}
        if args.budget is not None:
            epoch_cfg["kept_share"] = args.budget
        loader = EpochSiftingDataloader(epoch_cfg, source, num_epochs=args.epochs)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    met.clear_all()
    epochs = []
    for _ in range(args.epochs):
        n = 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            per_sample = torch.nn.functional.cross_entropy(model(xb), yb, reduction="none")
            loss = loader.weighted_loss(per_sample) if args.mode == "epoch" else per_sample.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch_xla.sync()
            n += 1
        kind = loader.plan.kind if args.mode == "epoch" else args.mode
        epochs.append(
            {
                "compiles": metric_count("CompileTime"),
                "reads": metric_count("TransferFromDeviceTime"),
                "batches": n,
                "kind": kind,
            }
        )
    out = {"epochs": epochs, "fallbacks": [k for k in met.counter_names() if k.startswith("aten::")]}
    if args.mode == "per-batch":
        out["counts"] = loader.counts.as_dict()
    if args.mode == "epoch":
        out["table_device"] = str(loader.tables._dev_scores.device)
        out["metrics"] = {k: v for k, v in loader.metrics().items() if k != "epochs"}
        out["kept"] = [h["kept"] for h in loader.history]
    return out


def shapes() -> dict:
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch.utils.data import DataLoader, TensorDataset

    from neuron_sift import SiftingDataloader

    torch.set_num_threads(1)
    device = torch_xla.device()
    for selection in ("probabilistic", "fixed"):
        for b, h in SHAPES:
            n = 3 * b + b // 3  # a short last batch
            g = torch.Generator().manual_seed(b + h)
            data = TensorDataset(torch.rand(n, 4, generator=g), torch.arange(n))
            loader = SiftingDataloader(
                sift_config=sift_config(selection, h),
                orig_dataloader=DataLoader(data, batch_size=b),
                loss_impl=ColumnLoss(),
                model=torch.nn.Linear(1, 1).to(device),
            )
            for _ in range(2):
                for _batch in loader:
                    pass
    return {"counters": sorted(met.counter_names()), "shapes": SHAPES}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["per-batch", "epoch", "plain", "shapes"], required=True)
    p.add_argument("--selection", choices=["fixed", "probabilistic"], default="fixed", help="per-batch mode")
    p.add_argument("--budget", type=float, default=None, help="epoch mode: the config's kept_share")
    p.add_argument("--score-table", choices=["replicated", "sharded"], default="replicated", help="epoch mode")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--source", choices=["dataloader", "mp"], default="dataloader")
    args = p.parse_args()
    print(json.dumps(shapes() if args.mode == "shapes" else training(args)))


if __name__ == "__main__":
    main()
