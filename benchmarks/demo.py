#!/usr/bin/env python
"""Train one small model with and without sifting on the CPU and compare the arms.

Arms (same data, same initial weights, same source batch order, same epochs):

* ``full``                plain ``DataLoader``, every sample is backpropagated;
* ``sift-probabilistic``  ``SiftingDataloader``, smart_sifting's rule: keep a sample with
                          probability ``percentile ** beta`` (expected share 1 / (1 + beta));
* ``sift-fixed``          ``SiftingDataloader`` with ``selection_mode="fixed"`` (neuron_sift
                          addition): exactly ``round(B / (1 + beta))`` samples of each source batch.

The data is generated locally with torch (no download): a noisy, nonlinear 10-class task
(each class a mixture of 20 Gaussian clusters in 8 dimensions, the inputs bent by a fixed
sine warp, then 5 % of the labels replaced by a random class), with a held-out test split
from the same distribution. The model is an MLP trained with Adam at a constant learning
rate, one intra-op thread by default (on a shared 2-core CPU, two threads spin against
other processes and the timings stop meaning anything; see ``--threads``).

What the table shows, honestly: the sifting arms run one extra (no-grad) forward pass per
source sample, plus the selection bookkeeping, to save backward passes. For a model this
small on a CPU, the saved backward passes are cheap and the extra work is not, so sifting
is expected to be *slower* here; the library's case is large models whose backward pass
dominates. Mislabelled samples keep a high loss, so sifting keeps them preferentially.
Nothing here is tuned to favour either side.

Run ``python benchmarks/demo.py --help`` for the options; ``--quick`` finishes in seconds.
"""

import argparse
import json
import math
import os
import platform
import sys
import time
from datetime import datetime, timezone

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import neuron_sift
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.loss.abstract_sift_loss_module import Loss
from neuron_sift.sift_config.sift_configs import LossConfig, RelativeProbabilisticSiftConfig, SiftingBaseConfig

ARMS = ("full", "sift-probabilistic", "sift-fixed")

# Problem sizes: (default run, --quick run).
SIZES = {
    "default": dict(n_train=80_000, n_test=20_000, epochs=15, sift_delay=100),
    "quick": dict(n_train=4_000, n_test=2_000, epochs=2, sift_delay=5),
}
N_FEATURES = 8
N_CLASSES = 10
CLUSTERS_PER_CLASS = 20
CLUSTER_STD = 0.3
LABEL_NOISE = 0.05
HIDDEN = 256
LR = 1e-3


# ---------------------------------------------------------------------------------------------
# data and model
# ---------------------------------------------------------------------------------------------


def make_dataset(n_train: int, n_test: int, seed: int):
    """``(x_train, y_train, x_test, y_test)``.

    ``N_CLASSES * CLUSTERS_PER_CLASS`` cluster centres ``~ N(0, I)`` in ``N_FEATURES``
    dimensions, each owned by one class; a sample picks a centre uniformly, adds
    ``N(0, CLUSTER_STD**2 I)`` and is bent by ``x + 0.5 sin(2 roll(x))``; its label is the
    centre's class, replaced by a uniformly random class with probability ``LABEL_NOISE``
    (train and test alike). Classes are balanced in expectation and overlap a little.
    """
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_test
    centres = torch.randn(N_CLASSES * CLUSTERS_PER_CLASS, N_FEATURES, generator=g)
    comp = torch.randint(0, centres.shape[0], (n,), generator=g)
    x = centres[comp] + CLUSTER_STD * torch.randn(n, N_FEATURES, generator=g)
    x = x + 0.5 * torch.sin(2.0 * x.roll(1, dims=1))
    y = comp % N_CLASSES
    noisy = torch.rand(n, generator=g) < LABEL_NOISE
    y = torch.where(noisy, torch.randint(0, N_CLASSES, (n,), generator=g), y)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(N_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, N_CLASSES),
    )


class PerSampleCrossEntropy(Loss):
    """The sifting loss: the training loss, one value per sample."""

    def __init__(self):
        self.criterion = nn.CrossEntropyLoss(reduction="none")

    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        return self.criterion(model(x), y)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    model.eval()
    logits = torch.cat([model(chunk) for chunk in x.split(4096)])
    model.train()
    return float((logits.argmax(dim=1) == y).float().mean()), float(F.cross_entropy(logits, y))


# ---------------------------------------------------------------------------------------------
# one arm
# ---------------------------------------------------------------------------------------------


def run_arm(arm: str, data, args, sizes) -> dict:
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(args.seed)  # same initial weights for every arm
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    order = torch.Generator().manual_seed(args.seed)  # same source batch order for every arm
    source = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True, generator=order)
    if arm == "full":
        loader = source
    else:
        config = RelativeProbabilisticSiftConfig(
            beta_value=args.beta,
            loss_history_length=args.history,
            loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=sizes["sift_delay"])),
            selection_mode="fixed" if arm == "sift-fixed" else "probabilistic",
            seed=args.seed,
        )
        loader = SiftingDataloader(
            sift_config=config,
            orig_dataloader=source,
            loss_impl=PerSampleCrossEntropy(),
            model=model,
        )

    steps = 0
    trained = 0
    acc_per_epoch = []
    train_s = 0.0
    for _ in range(sizes["epochs"]):
        model.train()
        start = time.perf_counter()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            trained += int(y.shape[0])
        train_s += time.perf_counter() - start
        acc_per_epoch.append(round(evaluate(model, x_test, y_test)[0], 4))  # not timed
    test_acc, test_loss = evaluate(model, x_test, y_test)

    seen = sizes["epochs"] * x_train.shape[0]
    result = {
        "source_samples_seen": seen,
        "samples_kept": seen,
        "samples_backpropagated": trained,
        "train_steps": steps,
        "kept_share": 1.0,
        "kept_share_sifted": None,
        "expected_kept_share_sifted": None,
        "wall_s": round(train_s, 3),
        "test_acc": round(test_acc, 4),
        "test_loss": round(test_loss, 4),
        "test_acc_per_epoch": acc_per_epoch,
    }
    if arm != "full":
        c = loader.counts
        if c.num_orig_samples_seen != seen:
            raise RuntimeError(f"{arm}: the loader saw {c.num_orig_samples_seen} source samples, expected {seen}")
        delayed_samples = _delayed_samples(c.num_source_batches_delayed, args.batch_size, x_train.shape[0])
        sifted_seen = c.num_orig_samples_seen - delayed_samples
        result.update(
            samples_kept=c.num_orig_samples_kept,
            kept_share=round(c.num_orig_samples_kept / c.num_orig_samples_seen, 4),
            kept_share_sifted=round((c.num_orig_samples_kept - delayed_samples) / sifted_seen, 4) if sifted_seen else None,
            expected_kept_share_sifted=round(1.0 / (1.0 + args.beta), 4),
            source_batches_delayed=c.num_source_batches_delayed,
            samples_pending_at_end=c.num_samples_pending,
        )
    return result


def _delayed_samples(n_delayed_batches: int, batch_size: int, n_train: int) -> int:
    """Samples that passed through unsifted during ``sift_delay``: the first
    ``n_delayed_batches`` source batches of training (all full but the last of an epoch)."""
    batches_per_epoch = math.ceil(n_train / batch_size)
    last = n_train - (batches_per_epoch - 1) * batch_size
    total = 0
    for i in range(n_delayed_batches):
        total += last if (i % batches_per_epoch) == batches_per_epoch - 1 else batch_size
    return total


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    d = SIZES["default"]
    p = argparse.ArgumentParser(
        prog="demo.py",
        description="Train a small MLP on a synthetic noisy 10-class task with and without neuron_sift "
        "sifting (arms: full, sift-probabilistic, sift-fixed) on the CPU; print kept share, "
        "training wall-clock time and test accuracy per arm. Every arm uses the same data, seed, "
        "initial weights, source batch order and epochs.",
    )
    p.add_argument("--epochs", type=int, default=None, help=f"epochs per arm (default {d['epochs']}; --quick: {SIZES['quick']['epochs']})")
    p.add_argument("--seed", type=int, default=0, help="seed of data, weights, batch order and selection draws (default 0)")
    p.add_argument("--beta", type=float, default=1.0, help="beta_value; expected kept share 1 / (1 + beta) (default 1.0)")
    p.add_argument("--history", type=int, default=500, help="loss_history_length (default 500)")
    p.add_argument("--batch-size", type=int, default=128, help="source and emitted batch size (default 128)")
    p.add_argument(
        "--sift-delay",
        type=int,
        default=None,
        help=f"source batches passed through unsifted at the start (default {d['sift_delay']}; --quick: {SIZES['quick']['sift_delay']})",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (default 1; 0: torch's own default)"
    )
    p.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)} (default: all)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a seconds-long run ({SIZES['quick']['n_train']} training samples instead of {d['n_train']}, fewer epochs)",
    )
    p.add_argument("--json", metavar="PATH", help="append one JSON line per arm (versions, config, results) to PATH")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        p.error(f"--arms: unknown arm(s) {bad}; choose from {', '.join(ARMS)}")
    args.arms = arms
    if args.beta <= 0:
        p.error("--beta must be > 0")
    for name in ("history", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.epochs is not None and args.epochs < 1:
        p.error("--epochs must be >= 1")
    if args.sift_delay is not None and args.sift_delay < 0:
        p.error("--sift-delay must be >= 0")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    return args


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "neuron_sift": neuron_sift.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = dict(SIZES["quick" if args.quick else "default"])
    if args.epochs is not None:
        sizes["epochs"] = args.epochs
    if args.sift_delay is not None:
        sizes["sift_delay"] = args.sift_delay
    config = {
        "quick": args.quick,
        "seed": args.seed,
        "epochs": sizes["epochs"],
        "beta_value": args.beta,
        "loss_history_length": args.history,
        "batch_size": args.batch_size,
        "sift_delay": sizes["sift_delay"],
        "n_train": sizes["n_train"],
        "n_test": sizes["n_test"],
        "n_features": N_FEATURES,
        "n_classes": N_CLASSES,
        "clusters_per_class": CLUSTERS_PER_CLASS,
        "cluster_std": CLUSTER_STD,
        "label_noise": LABEL_NOISE,
        "model": f"MLP {N_FEATURES}-{HIDDEN}-{HIDDEN}-{N_CLASSES}",
        "optimizer": f"Adam lr={LR}",
    }
    vers = versions()
    data = make_dataset(sizes["n_train"], sizes["n_test"], args.seed)
    print(
        f"neuron_sift {vers['neuron_sift']}, torch {vers['torch']}, {vers['torch_threads']} thread(s); "
        f"{sizes['n_train']} train / {sizes['n_test']} test samples, {sizes['epochs']} epoch(s), "
        f"batch {args.batch_size}, beta {args.beta:g} (expected kept share {1 / (1 + args.beta):.1%}), "
        f"history {args.history}, sift_delay {sizes['sift_delay']} source batches, seed {args.seed}",
        flush=True,
    )
    rows = []
    for arm in args.arms:
        result = run_arm(arm, data, args, sizes)
        rows.append((arm, result))
        print(f"  {arm}: done in {result['wall_s']:.1f} s", flush=True)
        if args.json:
            line = {
                "arm": arm,
                "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "versions": vers,
                "config": config,
                "results": result,
            }
            with open(args.json, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

    header = f"{'arm':<20} {'kept':>7} {'kept*':>7} {'backprop':>9} {'steps':>6} {'wall s':>8} {'test acc':>9} {'test loss':>9}"
    print()
    print(header)
    print("-" * len(header))
    for arm, r in rows:
        print(
            f"{arm:<20} {r['kept_share']:>7.1%} {_fmt(r['kept_share_sifted'], '>7.1%'):>7} "
            f"{r['samples_backpropagated']:>9} {r['train_steps']:>6} {r['wall_s']:>8.2f} "
            f"{r['test_acc']:>9.2%} {r['test_loss']:>9.4f}"
        )
    print(
        "\nkept: kept / seen over all source samples (the delay passes everything); kept*: the same "
        "after the delay only.\nwall s: training loop only (sifting arms include the scoring forward "
        "pass and selection), evaluation excluded."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
