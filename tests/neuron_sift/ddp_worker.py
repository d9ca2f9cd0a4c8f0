"""One rank of a DDP training run with sifting, in either mode; launched by torchrun from
test_distributed.py (``--mode per-batch``) and epoch/test_epoch_distributed.py (``--mode epoch``).

Both modes train the same small classifier with DistributedDataParallel (gloo, CPU) on the
same dataset of 1003 samples: not a multiple of the world size nor of the batch size, so
samplers pad or leave remainders and epochs end with a short batch. The set-up, the
checkpoint plumbing and the output (one JSON file per rank, ``rank{r}.json`` or
``rank{r}_resumed.json``) are shared so both modes face the same distributed situation;
each mode keeps the loop its tests check.

``--mode per-batch``: a ``SiftingDataloader`` over a ``DistributedSampler``. Writes steps
per epoch, emitted ids, final parameters, the loss history, and per epoch the pending
samples at its end, at most, and dropped so far. ``--skewed``: rank 0's labels are random
(hard, high losses), the other ranks' follow a rule (easy), so with a global history rank 0
keeps far more than its peers.

``--mode epoch``: an ``EpochSiftingDataloader`` that plans one global order and shards it.
Writes batches per epoch, trained ids, each epoch's plan (a hash of the global order), the
merged scores at the start of the last sifted epoch, the final parameters and how many
all-reduces sifting issued; ``--subset``, ``--boundary`` and ``--resume`` select the
scenarios described at their functions.
"""

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, SubsetRandomSampler, TensorDataset

from neuron_sift import EpochSiftingDataloader, RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.torchrun import release_process_group

CALLS = {"all_reduce": 0}


def counting(fn):
    def wrapped(*a, **k):
        CALLS["all_reduce"] += 1
        return fn(*a, **k)

    return wrapped


@dataclass
class Run:
    """What every rank sets up the same way in both modes."""

    args: argparse.Namespace
    rank: int
    world: int
    data: TensorDataset
    net: torch.nn.Module  # the plain module: scoring and checkpoints use it
    model: DDP

    def path(self, name: str) -> str:
        return os.path.join(self.args.out, f"{name}_rank{self.rank}.pt")

    def params(self) -> list[float]:
        return torch.cat([q.detach().flatten() for q in self.model.parameters()]).tolist()

    def save(self, name: str, opt, loader, **extra: Any) -> None:
        """Model, optimizer and loader (and ``extra``, e.g. the epoch to resume in)."""
        state = {"model": self.net.state_dict(), "opt": opt.state_dict(), "loader": loader.state_dict()}
        torch.save({**state, **extra}, self.path(name))

    def load(self, name: str, opt, loader) -> dict:
        saved = torch.load(self.path(name), weights_only=True)
        self.net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        loader.load_state_dict(saved["loader"])
        return saved

    def finish(self, out: dict, resumed: bool = False) -> None:
        with open(os.path.join(self.args.out, f"rank{self.rank}{'_resumed' if resumed else ''}.json"), "w") as f:
            json.dump(out, f)
        dist.barrier()
        del self.model  # DDP (and its reducer) hold the process group: see torchrun.release_process_group
        release_process_group()


def set_up(args) -> Run:
    dist.init_process_group("gloo")
    dist.all_reduce = counting(dist.all_reduce)  # count sifting's collectives (DDP's own go through its reducer)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    if args.skewed and rank == 0:
        y = torch.randint(0, 2, (args.samples,), generator=torch.Generator().manual_seed(2))
    data = TensorDataset(torch.arange(args.samples), x, y)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    return Run(args, rank, world, data, net, DDP(net))


# --- per-batch mode --------------------------------------------------------------------


class CrossEntropy:
    """The model's own per-sample loss: scores change with every training step."""

    def loss(self, model, transformed_batch, original_batch=None):
        _ids, x, y = original_batch
        return F.cross_entropy(model(x), y, reduction="none")


def per_batch(run: Run) -> None:
    """Trains ``--epochs``; ``--save-after``: checkpoints after that many steps (with
    ``--save-mid-agreement``, at the first such step where agreed batches are still to be
    emitted); ``--load``: resumes from that checkpoint."""
    args = run.args
    sampler = DistributedSampler(run.data, shuffle=True, seed=3)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=args.beta,
            loss_history_length=64,
            loss_based_sift_config={"sift_config": {"sift_delay": 2}},
            selection_mode=args.selection,
            seed=0,
            global_loss_history=args.global_history,
        ),
        orig_dataloader=DataLoader(run.data, batch_size=args.batch_size, sampler=sampler),
        loss_impl=CrossEntropy(),
        model=run.net,  # score with the plain module: no DDP collectives in the scoring pass
    )
    opt = torch.optim.SGD(run.model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = run.load("state", opt, loader)["epoch"] if args.load else 0
    steps, ids_seen, total, saved_at = [], [], 0, None
    backlog = []  # per epoch: pending at its end, most pending during it, dropped so far
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        n, most = 0, loader.num_pending
        for ids, xb, yb in loader:
            loss = F.cross_entropy(run.model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
            total += 1
            most = max(most, loader.num_pending)
            ids_seen.append(ids.tolist())
            due = args.save_after and saved_at is None and total >= args.save_after
            if due and (not args.save_mid_agreement or loader.agreement.budget_left > 0):
                saved_at = {"step": total, "budget_left": loader.agreement.budget_left}
                run.save("state", opt, loader, epoch=epoch)
        steps.append(n)
        backlog.append([loader.num_pending, max(most, loader.num_pending), loader.counts.num_samples_dropped])
    out = {
        "rank": run.rank,
        "world": run.world,
        "steps": steps,
        "ids": ids_seen,
        "params": run.params(),
        "history": loader.sifter.state.history.tolist(),
        "fill": int(loader.sifter.state.fill),
        "counts": loader.counts.as_dict(),
        "backlog": backlog,
        "max_pending": loader.max_pending,
        "saved_at": saved_at,
    }
    run.finish(out, resumed=args.load)


# --- epoch mode ------------------------------------------------------------------------


def subset_of(samples: int) -> list[int]:
    """The ``--subset split`` scenario's training split: two samples in three."""
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


def epoch_source(run: Run):
    """The user's DataLoader: shuffled, or a SubsetRandomSampler with the dataset's reads
    recorded: over a split (``--subset split``), or over a shard of its own on each rank
    (``--subset per-rank``, which the loader refuses)."""
    args = run.args
    if args.subset is None:
        return DataLoader(run.data, batch_size=args.batch_size, shuffle=True), None
    logged = Reads(run.data)
    if args.subset == "split":
        indices = subset_of(args.samples)
    else:
        indices = list(range(run.rank, args.samples, run.world))
    return DataLoader(logged, batch_size=args.batch_size, sampler=SubsetRandomSampler(indices)), logged


def train_step(run: Run, opt, loader, xb, yb) -> torch.Tensor:
    loss = loader.weighted_loss(F.cross_entropy(run.model(xb), yb, reduction="none"))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def boundary(run: Run, opt, loader) -> dict:
    """``--boundary save``: a run that checkpoints (with the epoch it is in) right after epoch
    1's last batch, inside the loop; ``--boundary load``: the loop resumed from it "at the
    epoch you were in". Returns the ids per step, where the cut was, ``planned_steps()`` at
    the start and the final parameters."""
    args = run.args
    start = run.load("boundary", opt, loader)["epoch"] if args.boundary == "load" else 0
    cut, steps = None, []
    planned = loader.planned_steps()
    for epoch in range(start, args.epochs):
        for n, (ids, xb, yb) in enumerate(loader, 1):
            train_step(run, opt, loader, xb, yb)
            steps.append(ids.tolist())
            if args.boundary == "save" and epoch == 1 and n == len(loader):
                cut = len(steps)
                run.save("boundary", opt, loader, epoch=epoch)
    return {"rank": run.rank, "ids": steps, "cut": cut, "planned": planned, "params": run.params()}


def resume(run: Run, opt, loader) -> dict:
    """``--resume save``: the whole run, checkpointing after ``--save-after`` steps;
    ``--resume load``: the run resumed from that checkpoint in fresh processes. Returns the
    ids and the weighted loss of every step and the final parameters."""
    args = run.args
    if args.resume == "load":
        run.load("resume", opt, loader)
    ids, losses, saved_in_epoch = [], [], None
    while loader.epoch < args.epochs or loader.resuming:
        for batch_ids, xb, yb in loader:
            loss = train_step(run, opt, loader, xb, yb)
            ids.append(batch_ids.tolist())
            losses.append(loss.item())
            if args.resume == "save" and len(ids) == args.save_after:
                saved_in_epoch = (loader.state_dict()["in_progress"], loader.plan.kind)
                run.save("resume", opt, loader)
    return {"rank": run.rank, "ids": ids, "losses": losses, "params": run.params(), "saved_in_epoch": saved_in_epoch}


def whole_run(run: Run, opt, loader, logged) -> dict:
    """``--epochs`` epochs with each epoch's plan, the merged scores its last sifted epoch
    planned from, and the collectives sifting issued."""
    args = run.args
    steps, ids_seen, plans, merged = [], [], [], None
    for epoch in range(args.epochs):
        loader.start_epoch()
        it = iter(loader)
        plans.append(hashlib.sha1(loader.plan.order.numpy().tobytes()).hexdigest())
        if epoch == args.epochs - 2:  # the last sifted epoch: planned from merged scores
            merged = loader.tables.snapshot().nan_to_num(-1.0).tolist()
        n = 0
        for ids, xb, yb in it:
            train_step(run, opt, loader, xb, yb)
            n += 1
            ids_seen.append(ids.tolist())
        steps.append(n)
    return {
        "rank": run.rank,
        "world": run.world,
        "steps": steps,
        "ids": ids_seen,
        "plans": plans,
        "merged": merged,
        "params": run.params(),
        "all_reduce": CALLS["all_reduce"],
        "kept": [h["kept"] for h in loader.history],
        "reads": None if logged is None else logged.reads,
    }


def epoch_level(run: Run) -> None:
    args = run.args
    cfg: dict[str, Any] = {"seed": 7, "anneal_fraction": 0.2, "start_rank_correlation": None}
    if args.budget is not None:
        cfg["kept_share"] = args.budget
    dl, logged = epoch_source(run)
    try:
        loader = EpochSiftingDataloader(cfg, dl, num_epochs=args.epochs)
    except ValueError as exc:  # every rank refuses a per-rank sampler, none waits in a collective
        run.finish({"rank": run.rank, "refused": str(exc), "reads": logged.reads if logged else None})
        return
    opt = torch.optim.SGD(run.model.parameters(), lr=args.lr)
    if args.boundary is not None:
        run.finish(boundary(run, opt, loader), resumed=args.boundary == "load")
    elif args.resume is not None:
        run.finish(resume(run, opt, loader), resumed=args.resume == "load")
    else:
        run.finish(whole_run(run, opt, loader, logged))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["per-batch", "epoch"], required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1003)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--save-after", type=int, default=0, help="save a checkpoint after this many steps")
    p.add_argument("--out", required=True)
    per = p.add_argument_group("per-batch mode")
    per.add_argument("--selection", choices=["probabilistic", "fixed"], default="probabilistic")
    per.add_argument("--beta", type=float, default=1.0)
    per.add_argument("--global-history", action="store_true")
    per.add_argument("--skewed", action="store_true", help="rank 0's labels random, the others' easy")
    per.add_argument(
        "--save-mid-agreement",
        action="store_true",
        help="save at the first step >= --save-after where agreed batches are still to be emitted",
    )
    per.add_argument("--load", action="store_true", help="resume from the saved per-rank state")
    epoch = p.add_argument_group("epoch mode")
    epoch.add_argument("--budget", type=float, default=None, help="the config's kept_share")
    epoch.add_argument("--subset", choices=["split", "per-rank"], default=None)
    epoch.add_argument("--boundary", choices=["save", "load"], default=None)
    epoch.add_argument("--resume", choices=["save", "load"], default=None)
    args = p.parse_args()
    run = set_up(args)
    if args.mode == "per-batch":
        per_batch(run)
    else:
        epoch_level(run)


if __name__ == "__main__":
    main()
