"""One rank of a DDP training run with sifting; launched by torchrun from test_distributed.py.

Trains a small classifier with DistributedDataParallel (gloo, CPU) on a dataset whose size
is not a multiple of the world size, so DistributedSampler pads, and whose per-rank size is
not a multiple of the batch size, so every epoch ends with a short batch. Writes one JSON
file per rank: steps per epoch, emitted sample ids, the final parameters, the history, and
per epoch the pending (kept, not yet emitted) samples at its end and at most, and the
samples dropped so far. ``--skewed``: rank 0's labels are random (hard, high losses), the
other ranks' follow a rule (easy), so with a global history rank 0 keeps far more than
its peers. A checkpoint holds the model, the optimizer and the loader.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.torchrun import release_process_group


class CrossEntropy:
    """The model's own per-sample loss: scores change with every training step."""

    def loss(self, model, transformed_batch, original_batch=None):
        _ids, x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="probabilistic")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1003)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--global-history", action="store_true")
    p.add_argument("--skewed", action="store_true", help="rank 0's labels random, the others' easy")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--save-after", type=int, default=0, help="save a checkpoint after this many steps")
    p.add_argument(
        "--save-mid-agreement",
        action="store_true",
        help="save at the first step >= --save-after where agreed batches are still to be emitted",
    )
    p.add_argument("--load", action="store_true", help="resume from the saved per-rank state")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    if args.skewed and rank == 0:
        y = torch.randint(0, 2, (args.samples,), generator=torch.Generator().manual_seed(2))
    data = TensorDataset(torch.arange(args.samples), x, y)
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    source = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    model = DDP(net)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=args.beta,
            loss_history_length=64,
            loss_based_sift_config={"sift_config": {"sift_delay": 2}},
            selection_mode=args.mode,
            seed=0,
            global_loss_history=args.global_history,
        ),
        orig_dataloader=source,
        loss_impl=CrossEntropy(),
        model=model.module,  # score with the plain module: no DDP collectives in the scoring pass
    )
    state_path = os.path.join(args.out, f"state_rank{rank}.pt")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    saved_at = None
    if args.load:
        saved = torch.load(state_path, weights_only=True)
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        loader.load_state_dict(saved["loader"])
        start_epoch = saved["epoch"]
    steps, ids_seen, total = [], [], 0
    backlog = []  # per epoch: pending at its end, most pending during it, dropped so far
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        n, most = 0, loader.num_pending
        for ids, xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
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
                state = {"loader": loader.state_dict(), "model": net.state_dict(), "opt": opt.state_dict()}
                torch.save({**state, "epoch": epoch}, state_path)
        steps.append(n)
        backlog.append([loader.num_pending, max(most, loader.num_pending), loader.counts.num_samples_dropped])
    params = torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()
    with open(os.path.join(args.out, f"rank{rank}{'_resumed' if args.load else ''}.json"), "w") as f:
        json.dump(
            {
                "rank": rank,
                "world": world,
                "steps": steps,
                "ids": ids_seen,
                "params": params,
                "history": loader.sifter.state.history.tolist(),
                "fill": int(loader.sifter.state.fill),
                "counts": loader.counts.as_dict(),
                "backlog": backlog,
                "max_pending": loader.max_pending,
                "saved_at": saved_at,
            },
            f,
        )
    dist.barrier()
    del model  # DDP (and its reducer) hold the process group: see torchrun.release_process_group
    release_process_group()


if __name__ == "__main__":
    main()
