#!/usr/bin/env python
"""What does epoch-level sifting itself cost? Per training step, and per epoch's planning.

Per step (``EpochSiftingDataloader.weighted_loss`` against the plain ``per_sample.mean()``
the loop would compute anyway): the pairing of the batch's ids, the scatter of the losses
into the score table, the gather of the weights and the weighted mean, forward and
backward of the loss. Measured two ways at the suite's default model and batch size (the
MNIST-1D 1-D CNN, B = 128):

* ``isolated``: the loss call plus its backward, with the batch's ids pushed as the loader
  pushes them, against ``mean()`` plus its backward on the same per-sample losses, median
  of many alternating repeats; divided by one training step (forward, backward, Adam) of
  the default model, timed in the same repeats;
* ``end_to_end``: one epoch of training through the ``EpochSiftingDataloader`` (a warm-up
  epoch, every sample, so the batches are the same as the plain loader's) against one
  epoch through the plain ``DataLoader``, alternating; the difference per step over the
  plain step.

Planning: opening a sifted epoch (``loader.opener.open``: read the table, merge, policy, systematic
sampling, weights, batches) for a table of ``--planning-n`` scores (default 1,000,000),
per policy and budget form, against the time of one epoch of that many samples of the
default model (steps x the measured training step).

``--backend xla`` keeps the tables on torch-xla's device (``PJRT_DEVICE=CPU`` here) for
the planning measurement (the snapshot is then the one device-to-host transfer).

Times are the process's CPU time by default (``--clock cpu``: on a shared machine the
wall-clock mostly measures the other processes; one thread), or the wall-clock.

Output: a table and one JSON line per measurement (``--out``, default
``benchmarks/results/epoch_machinery.jsonl``, appended).
"""

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.instruments.options import CLOCKS, add_clock, add_threads, use_threads
from benchmarks.tasks.mnist1d import CNN1D
from neuron_sift import EpochSiftingDataloader

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "epoch_machinery.jsonl"
CLOCK = CLOCKS["cpu"]  # --clock: process CPU time (default; a shared machine) or wall-clock


class Stub(Dataset):
    """``n`` samples of the default model's input (one shared row): planning never loads any."""

    def __init__(self, n: int):
        self.n = n
        self.x = torch.randn(40)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.x, 0


def train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def per_step(args) -> dict:
    torch.manual_seed(0)
    b, n = args.batch_size, args.n
    x = torch.randn(n, 40)
    y = torch.randint(0, 10, (n,))
    model = CNN1D()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = EpochSiftingDataloader({"seed": 0}, DataLoader(TensorDataset(x, y), batch_size=b), num_epochs=10)
    ids = np.arange(b, dtype=np.int64)
    xb, yb = x[:b], y[:b]
    steps, sifted, plain = [], [], []
    for r in range(args.repeats):
        t0 = CLOCK()
        train_step(model, opt, xb, yb)
        steps.append(CLOCK() - t0)
        logits = model(xb).detach().requires_grad_()
        per_sample = F.cross_entropy(logits, yb, reduction="none")
        if r % 2:
            t0 = CLOCK()
            loader.pairing.push(ids, loader.progress.current_epoch)
            loader.weighted_loss(per_sample).backward()
            sifted.append(CLOCK() - t0)
        else:
            t0 = CLOCK()
            per_sample.mean().backward()
            plain.append(CLOCK() - t0)
    step = statistics.median(steps)
    extra = statistics.median(sifted) - statistics.median(plain)
    out = {
        "measure": "per_step_isolated",
        "n": n,
        "batch_size": b,
        "step_ms": step * 1e3,
        "weighted_loss_ms": statistics.median(sifted) * 1e3,
        "mean_ms": statistics.median(plain) * 1e3,
        "extra_ms": extra * 1e3,
        "share_of_step": extra / step,
    }
    # end to end: a warm-up epoch through the loader vs the plain DataLoader, same batches
    epochs_s, epochs_p = [], []
    m = min(n, args.e2e_n)
    data = TensorDataset(x[:m], y[:m])
    for r in range(args.e2e_repeats):
        loader = EpochSiftingDataloader({"seed": r}, DataLoader(data, batch_size=b), num_epochs=10)
        t0 = CLOCK()
        k = 0
        for xb2, yb2 in loader:
            loss = loader.weighted_loss(F.cross_entropy(model(xb2), yb2, reduction="none"))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            k += 1
        epochs_s.append((CLOCK() - t0) / k)
        plain_loader = DataLoader(data, batch_size=b, shuffle=True, generator=torch.Generator().manual_seed(r))
        t0 = CLOCK()
        k = 0
        for xb2, yb2 in plain_loader:
            loss = F.cross_entropy(model(xb2), yb2, reduction="none").mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            k += 1
        epochs_p.append((CLOCK() - t0) / k)
    diffs = [s - p for s, p in zip(epochs_s, epochs_p, strict=True)]
    e2e = {
        "measure": "per_step_end_to_end",
        "n": m,
        "batch_size": b,
        "sifted_step_ms": statistics.median(epochs_s) * 1e3,
        "plain_step_ms": statistics.median(epochs_p) * 1e3,
        "extra_ms": statistics.median(diffs) * 1e3,
        "share_of_step": statistics.median(diffs) / statistics.median(epochs_p),
    }
    return {"isolated": out, "end_to_end": e2e, "step_s": step}


def planning(args, step_s: float) -> list:
    n, b = args.planning_n, args.batch_size
    rng = np.random.default_rng(0)
    scores = rng.lognormal(0.0, 1.0, n).astype(np.float32)
    device = None
    if args.backend == "xla":
        import torch_xla

        device = torch_xla.device()
    rows = []
    cases: list[tuple[str, dict[str, Any]]] = [
        ("percentile", {}),
        ("percentile, budget 0.4", {"kept_share": 0.4}),
        ("below_mean", {"policy": "below_mean"}),
        ("below_mean, budget 0.4", {"policy": "below_mean", "kept_share": 0.4}),
    ]
    for name, cfg in cases:
        loader = EpochSiftingDataloader(
            {"seed": 0, **cfg}, DataLoader(Stub(n), batch_size=b), num_epochs=10, device=device
        )
        loader.tables.load_scores(torch.from_numpy(scores))
        times = []
        kept = 0
        for r in range(args.planning_repeats):
            t0 = CLOCK()
            plan, _ = loader.opener.open(1 + r % 7, loader.plan)  # a sifted epoch
            times.append(CLOCK() - t0)
            kept = plan.kept
        t = statistics.median(times)
        epoch_s = (n / b) * step_s
        rows.append(
            {
                "measure": "planning",
                "policy": name,
                "n": n,
                "backend": args.backend,
                "planning_s": t,
                "epoch_s_estimate": epoch_s,
                "share_of_epoch": t / epoch_s,
                "kept": kept,
            }
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--n", type=int, default=40_000, help="samples of the per-step measurement's table")
    p.add_argument("--repeats", type=int, default=400)
    p.add_argument("--e2e-n", type=int, default=12_800, help="samples of each end-to-end epoch")
    p.add_argument("--e2e-repeats", type=int, default=5)
    p.add_argument("--planning-n", type=int, default=1_000_000)
    p.add_argument("--planning-repeats", type=int, default=7)
    p.add_argument("--backend", choices=("eager", "xla"), default="eager")
    add_threads(p, help="torch intra-op threads (default 1; 0: torch's default)")
    add_clock(p, help="process CPU time (default: robust on a shared machine; one thread) or wall-clock", default="cpu")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    global CLOCK
    CLOCK = CLOCKS[args.clock]
    use_threads(args.threads)
    step = per_step(args)
    rows = [step["isolated"], step["end_to_end"]] + planning(args, step["step_s"])
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        for r in rows:
            f.write(
                json.dumps(
                    {"time": stamp, "torch": torch.__version__, "threads": args.threads, "clock": args.clock, **r}
                )
                + "\n"
            )
    iso, e2e = step["isolated"], step["end_to_end"]
    print(f"training step of the default model (B={args.batch_size}): {iso['step_ms']:.3f} ms")
    print(
        f"per step, isolated: weighted_loss+backward {iso['weighted_loss_ms']:.4f} ms vs mean+backward "
        f"{iso['mean_ms']:.4f} ms: +{iso['extra_ms']:.4f} ms = {100 * iso['share_of_step']:.2f}% of a step"
    )
    print(
        f"per step, end to end: {e2e['sifted_step_ms']:.3f} vs {e2e['plain_step_ms']:.3f} ms per step: "
        f"{e2e['extra_ms']:+.4f} ms = {100 * e2e['share_of_step']:+.2f}% of a step"
    )
    for r in rows[2:]:
        print(
            f"planning {r['n']:,} scores ({r['policy']}, {r['backend']}): {r['planning_s'] * 1e3:.1f} ms = "
            f"{100 * r['share_of_epoch']:.2f}% of an epoch of that many samples ({r['epoch_s_estimate']:.1f} s)"
        )
    print(f"records: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
