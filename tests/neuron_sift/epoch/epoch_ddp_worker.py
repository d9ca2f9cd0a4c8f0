"""One rank of a DDP run with epoch-level sifting; launched by torchrun from test_epoch_distributed.py.

A dataset whose size (1003) is not a multiple of the world size nor of the batch size; DDP
(gloo, CPU) keeps parameters in sync. Writes one JSON file per rank: batches per epoch,
trained ids, each epoch's plan (a hash of the global order), the merged scores at the start
of the last sifted epoch, the final parameters, and how many all-reduces sifting issued.
"""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.torchrun import release_process_group

CALLS = {"all_reduce": 0}


def counting(fn):
    def wrapped(*a, **k):
        CALLS["all_reduce"] += 1
        return fn(*a, **k)

    return wrapped


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=1003)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--oracle", action="store_true")
    p.add_argument("--save-after", type=int, default=0)
    p.add_argument("--load", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    dist.init_process_group("gloo")
    dist.all_reduce = counting(dist.all_reduce)  # count sifting's collectives (DDP's own go through its reducer)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    data = TensorDataset(torch.arange(args.samples), x, y)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    model = DDP(net)
    cfg = {"seed": 7, "anneal_fraction": 0.2}
    if args.budget is not None:
        cfg["kept_share"] = args.budget
    loader = EpochSiftingDataloader(
        cfg, DataLoader(data, batch_size=args.batch_size, shuffle=True), num_epochs=args.epochs
    )
    state_path = os.path.join(args.out, f"state_rank{rank}.pt")
    if args.load:
        loader.load_state_dict(torch.load(state_path, weights_only=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps, ids_seen, plans, total = [], [], [], 0
    merged = None
    start_epoch = loader.epoch - (1 if args.load and loader.resuming else 0)
    for epoch in range(start_epoch, args.epochs):
        loader.start_epoch()
        it = iter(loader)
        plans.append(hashlib.sha1(loader.plan.order.numpy().tobytes()).hexdigest())
        if epoch == args.epochs - 2:  # the last sifted epoch: planned from merged scores
            merged = loader.tables.snapshot().nan_to_num(-1.0).tolist()
        n = 0
        for ids, xb, yb in it:
            per_sample = F.cross_entropy(model(xb), yb, reduction="none")
            if args.oracle:
                per_sample = per_sample * 0 + ((ids * 7919) % 1009).float() / 1009.0
            loss = loader.weighted_loss(per_sample)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
            total += 1
            ids_seen.append(ids.tolist())
            if args.save_after and total == args.save_after:
                torch.save(loader.state_dict(), state_path)
        steps.append(n)
    params = torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()
    with open(os.path.join(args.out, f"rank{rank}{'_resumed' if args.load else ''}.json"), "w") as f:
        json.dump(
            {
                "rank": rank,
                "world": world,
                "steps": steps,
                "ids": ids_seen,
                "plans": plans,
                "merged": merged,
                "params": params,
                "all_reduce": CALLS["all_reduce"],
                "kept": [h["kept"] for h in loader.history],
            },
            f,
        )
    dist.barrier()
    del model  # DDP (and its reducer) hold the process group: see torchrun.release_process_group
    release_process_group()


if __name__ == "__main__":
    main()
