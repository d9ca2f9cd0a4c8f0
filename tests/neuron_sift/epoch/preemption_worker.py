"""One rank of a training run that torchrun restarts after a rank is killed; launched by
resuming/test_preemption.py with ``--max-restarts=1``.

The training loop and the checkpoint plumbing are the documentation's own
(docs/checkpoints.md, "Preemption: checkpoint, restart, resume"): the test writes those blocks to
``--recipe`` and this worker runs them, so the recipe users copy is the code that survives
the kill. What the worker adds is observation and the fault:

- a ``Watched`` wrapper around the loader logs every trained batch's ids with (attempt,
  epoch, step) to ``log_rank{r}.jsonl`` (and, for the epoch mode, each epoch's plan once
  per attempt), written and flushed before the loop asks for the next batch;
- on the first attempt (``TORCHELASTIC_RESTART_COUNT == "0"``) rank 1 kills itself with
  SIGKILL at the first step of an epoch >= ``--kill-epoch`` that is ``--kill-after`` steps
  after a checkpoint: no handler runs, no file is closed, as when a machine is reclaimed;
- with ``--kill-in-save``, rank 1 dies instead inside its checkpoint of such a step, once
  rank 0 has written its own: the ranks' newest checkpoints then differ, and the restart
  must take the newest step both wrote;
- at the end each rank writes ``rank{r}.json`` with its parameters.

``--checkpoints files``: the recipe's per-rank files (``on_disk``: this rank's steps at the
start); ``--checkpoints dcp``: its torch.distributed.checkpoint functions (``on_disk``:
[step, complete] of every checkpoint directory at the start).

``--mode epoch``: an ``EpochSiftingDataloader`` (warm-up, sifted epochs with a budget, an
annealing epoch). ``--mode per-batch``: a ``SiftingDataloader`` over a seeded
``DistributedSampler``.
"""

import argparse
import json
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from neuron_sift import EpochSiftingDataloader, Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.torchrun import release_process_group


class Watched:
    """The loader as the recipe's loop sees it, logging each batch once it has trained.

    A batch has trained (loss, step, and the checkpoint due at that step) when the loop asks
    for the next one, so that is where it is logged, and where the fault strikes: between
    two steps, a few steps after a checkpoint."""

    def __init__(self, inner, args, rank: int, attempt: int, step: int, epoch_of) -> None:
        self.inner, self.args, self.rank, self.attempt = inner, args, rank, attempt
        self.step, self.epoch_of = step, epoch_of
        self.log = open(os.path.join(args.out, f"log_rank{rank}.jsonl"), "a")  # noqa: SIM115 (closed in close())
        self.planned: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __iter__(self):
        for batch in self.inner:
            yield batch
            self.trained(batch)

    def write(self, entry: dict) -> None:
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()  # in the kernel before a SIGKILL can strike

    def state_dict(self) -> dict:
        """The loader's state, as the recipe's ``save_checkpoint`` asks for it; with
        ``--kill-in-save`` rank 1 dies here, its peer's checkpoint of this step written."""
        a, step = self.args, self.step + 1  # the step being saved: logged only at the next batch
        if a.kill_in_save and self.attempt == 0 and self.rank == 1 and self.epoch_of() >= a.kill_epoch:
            peer = os.path.join(a.ckpts or os.path.join(a.out, "ckpts"), f"step{step:09d}-rank0-of2.pt")
            deadline = time.monotonic() + 60  # under DCP no rank's part is written before every rank's state
            while a.checkpoints == "files" and not os.path.exists(peer) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.write({"killed": step, "epoch": self.epoch_of(), "in_save": True})
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.state_dict()

    def trained(self, batch) -> None:
        self.step += 1
        epoch = self.epoch_of()
        kind = None
        plan = getattr(self.inner, "plan", None)
        if plan is not None:
            kind = plan.kind
            if plan.epoch not in self.planned:
                self.planned.add(plan.epoch)
                self.write({"plan": plan.epoch, "attempt": self.attempt, "order": plan.order.tolist()})
        ids = batch[0].tolist()
        self.write({"attempt": self.attempt, "epoch": epoch, "step": self.step, "kind": kind, "ids": ids})
        a = self.args
        due = epoch >= a.kill_epoch and self.step % a.every == a.kill_after
        if self.attempt == 0 and self.rank == 1 and due and not a.kill_in_save:
            self.write({"killed": self.step, "epoch": epoch})
            os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> None:
        self.log.close()


class SiftLoss(Loss):
    """The per-batch loader's scoring loss, with the plain module (no DDP collectives)."""

    def loss(self, model, transformed_batch, original_batch=None):
        _ids, x, y = original_batch
        return F.cross_entropy(model(x), y, reduction="none")


def per_sample_loss(model, batch):
    _ids, x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def mean_loss(model, batch):
    return per_sample_loss(model, batch).mean()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["epoch", "per-batch"], required=True)
    p.add_argument("--recipe", required=True, help="the documentation's blocks, as one script")
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=320)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--every", type=int, default=8, help="checkpoint every this many steps")
    p.add_argument("--kill-epoch", type=int, default=1, help="rank 1 dies in this epoch or a later one")
    p.add_argument("--kill-after", type=int, default=3, help="... this many steps after a checkpoint")
    p.add_argument("--kill-in-save", action="store_true", help="rank 1 dies while saving, after rank 0 saved")
    p.add_argument("--ckpts", default=None, help="the checkpoint folder (default: OUT/ckpts)")
    p.add_argument("--score-table", choices=["replicated", "sharded"], default="replicated")
    p.add_argument("--checkpoints", choices=["files", "dcp"], default="files", help="which plumbing --recipe holds")
    args = p.parse_args()

    recipe: dict[str, Any] = {"__name__": "recipe"}
    with open(args.recipe, encoding="utf-8") as f:
        exec(compile(f.read(), args.recipe, "exec"), recipe)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP expects
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    data = TensorDataset(torch.arange(args.samples), x, (x[:, 0] + x[:, 1] > 0).long())
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = DDP(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=15, gamma=0.7)
    ckpt_dir = args.ckpts or os.path.join(args.out, "ckpts")
    if args.checkpoints == "files":
        found = recipe["newest_complete_checkpoint"](ckpt_dir)
        resumed_from = found[0] if found else 0  # where the recipe's loop will start
        files = recipe["checkpoints_on_disk"](ckpt_dir)
        # this rank's, at the start
        on_disk = sorted(s for (s, w), ranks in files.items() if w == world and rank in ranks)
    else:
        resumed_from = recipe["newest_checkpoint"](ckpt_dir) or 0
        on_disk = sorted([s, complete] for s, complete in recipe["checkpoints"](ckpt_dir).items())

    if args.mode == "epoch":
        source = DataLoader(data, batch_size=args.batch_size, shuffle=True)
        cfg = {
            "seed": 7,
            "kept_share": 0.5,
            "anneal_fraction": 0.25,
            "score_table": args.score_table,
            "start_rank_correlation": None,
        }
        inner = EpochSiftingDataloader(cfg, source, num_epochs=args.epochs)
        loader = Watched(inner, args, rank, attempt, resumed_from, lambda: inner.epoch - 1)  # the epoch in progress
        last = recipe["train_epoch_sifting"](
            model, loader, optimizer, scheduler, per_sample_loss, ckpt_dir, args.epochs, args.every
        )
    else:
        sampler: DistributedSampler = DistributedSampler(data, shuffle=True, seed=3)
        sifting = SiftingDataloader(
            sift_config=RelativeProbabilisticSiftConfig(
                beta_value=1.0,
                loss_history_length=64,
                loss_based_sift_config={"sift_config": {"sift_delay": 2}},
                seed=0,
            ),
            orig_dataloader=DataLoader(data, batch_size=args.batch_size, sampler=sampler),
            loss_impl=SiftLoss(),
            model=net,
        )
        loader = Watched(sifting, args, rank, attempt, resumed_from, lambda: sampler.epoch)
        last = recipe["train_sifting"](
            model, loader, sampler, optimizer, scheduler, mean_loss, ckpt_dir, args.epochs, args.every
        )
    loader.close()
    params = torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()
    out = {
        "rank": rank,
        "attempt": attempt,
        "resumed_from": resumed_from,
        "on_disk": on_disk,
        "last_step": last,
        "params": params,
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    del model  # DDP holds the process group: see torchrun.release_process_group
    release_process_group()


if __name__ == "__main__":
    main()
