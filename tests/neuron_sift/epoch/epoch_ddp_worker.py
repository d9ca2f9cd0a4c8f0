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
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler, TensorDataset

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.torchrun import release_process_group

CALLS = {"all_reduce": 0}


def counting(fn):
    def wrapped(*a, **k):
        CALLS["all_reduce"] += 1
        return fn(*a, **k)

    return wrapped


def subset_of(samples: int) -> list[int]:
    """The ``--subset`` scenario's training split: two samples in three."""
    return [i for i in range(samples) if i % 3 != 1]


class Reads(Dataset):
    """``data`` recording every index its ``__getitem__`` is asked for."""

    def __init__(self, data):
        self.data, self.reads = data, []

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        self.reads.append(int(i))
        return self.data[i]


def source(args, data, rank, world):
    """The user's DataLoader: shuffled, or a SubsetRandomSampler with the dataset's reads
    recorded: over a split (``--subset split``), or over a shard of its own on each rank
    (``--subset per-rank``, which the loader refuses)."""
    if args.subset is None:
        return DataLoader(data, batch_size=args.batch_size, shuffle=True), None
    logged = Reads(data)
    indices = subset_of(args.samples) if args.subset == "split" else list(range(rank, args.samples, world))
    sampler = SubsetRandomSampler(indices)
    return DataLoader(logged, batch_size=args.batch_size, sampler=sampler), logged


def boundary(args, model, opt, loader, rank) -> dict:
    """``--boundary save``: a run that checkpoints (model, optimizer, loader, the epoch it is
    in) right after epoch 1's last batch, inside the loop; ``--boundary load``: the loop
    resumed from it "at the epoch you were in". Returns the ids per step, where the cut
    was, ``planned_steps()`` at the start and the final parameters."""
    path = os.path.join(args.out, f"boundary_rank{rank}.pt")
    start, cut, steps = 0, None, []
    if args.boundary == "load":
        ckpt = torch.load(path, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["loader"])
        start = ckpt["epoch"]
    planned = loader.planned_steps()
    for epoch in range(start, args.epochs):
        for n, (ids, xb, yb) in enumerate(loader, 1):
            loss = loader.weighted_loss(F.cross_entropy(model(xb), yb, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps.append(ids.tolist())
            if args.boundary == "save" and epoch == 1 and n == len(loader):
                cut = len(steps)
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "loader": loader.state_dict()}
                torch.save({**state, "epoch": epoch}, path)
    params = torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()
    return {"rank": rank, "ids": steps, "cut": cut, "planned": planned, "params": params}


def resume(args, model, opt, loader, rank) -> dict:
    """``--resume save``: the whole run, checkpointing (model, optimizer, loader) after
    ``--save-after`` steps; ``--resume load``: the run resumed from that checkpoint in fresh
    processes. Returns the ids and the weighted loss of every step and the final parameters."""
    path = os.path.join(args.out, f"resume_rank{rank}.pt")
    if args.resume == "load":
        ckpt = torch.load(path, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["loader"])
    ids, losses, saved_in_epoch = [], [], None
    while loader.epoch < args.epochs or loader.resuming:
        for batch_ids, xb, yb in loader:
            loss = loader.weighted_loss(F.cross_entropy(model(xb), yb, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            ids.append(batch_ids.tolist())
            losses.append(loss.item())
            if args.resume == "save" and len(ids) == args.save_after:
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "loader": loader.state_dict()}
                saved_in_epoch = (state["loader"]["in_progress"], loader.plan.kind)
                torch.save(state, path)
    params = torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()
    return {"rank": rank, "ids": ids, "losses": losses, "params": params, "saved_in_epoch": saved_in_epoch}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=1003)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--oracle", action="store_true")
    p.add_argument("--save-after", type=int, default=0)
    p.add_argument("--load", action="store_true")
    p.add_argument("--subset", choices=["split", "per-rank"], default=None)
    p.add_argument("--boundary", choices=["save", "load"], default=None)
    p.add_argument("--resume", choices=["save", "load"], default=None)
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
    dl, logged = source(args, data, rank, world)
    try:
        loader = EpochSiftingDataloader(cfg, dl, num_epochs=args.epochs)
    except ValueError as exc:  # every rank refuses a per-rank sampler, none waits in a collective
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "refused": str(exc), "reads": logged.reads if logged else None}, f)
        del model
        release_process_group()
        return
    state_path = os.path.join(args.out, f"state_rank{rank}.pt")
    if args.load:
        loader.load_state_dict(torch.load(state_path, weights_only=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if args.boundary is not None or args.resume is not None:
        out = boundary(args, model, opt, loader, rank) if args.boundary else resume(args, model, opt, loader, rank)
        loaded = "load" in (args.boundary, args.resume)
        with open(os.path.join(args.out, f"rank{rank}{'_resumed' if loaded else ''}.json"), "w") as f:
            json.dump(out, f)
        dist.barrier()
        del model
        release_process_group()
        return
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
                "reads": None if logged is None else logged.reads,
            },
            f,
        )
    dist.barrier()
    del model  # DDP (and its reducer) hold the process group: see torchrun.release_process_group
    release_process_group()


if __name__ == "__main__":
    main()
