"""One rank of a DDP training run with sifting; launched by torchrun from test_distributed.py.

Trains a small classifier with DistributedDataParallel (gloo, CPU) on a dataset whose size
is not a multiple of the world size, so DistributedSampler pads, and whose per-rank size is
not a multiple of the batch size, so every epoch ends with a short batch. Writes one JSON
file per rank: steps per epoch, emitted sample ids, the final parameters, the history.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader


class OracleOrCE:
    """Cross-entropy of the model, or (``oracle``) a fixed loss per sample id, for exact replays."""

    def __init__(self, oracle: bool):
        self.oracle = oracle

    def loss(self, model, transformed_batch, original_batch=None):
        ids, x, y = original_batch
        if self.oracle:
            return ((ids * 7919) % 1009).float() / 1009.0
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="probabilistic")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1003)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--global-history", action="store_true")
    p.add_argument("--oracle", action="store_true")
    p.add_argument("--save-after", type=int, default=0, help="save the loader state after this many steps")
    p.add_argument("--load", action="store_true", help="resume from the saved per-rank state")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
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
        loss_impl=OracleOrCE(args.oracle),
        model=model.module,  # score with the plain module: no DDP collectives in the scoring pass
    )
    state_path = os.path.join(args.out, f"state_rank{rank}.pt")
    start_epoch = 0
    if args.load:
        saved = torch.load(state_path, weights_only=True)
        loader.load_state_dict(saved["loader"])
        start_epoch = saved["epoch"]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps, ids_seen, total = [], [], 0
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        n = 0
        for ids, xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
            total += 1
            ids_seen.append(ids.tolist())
            if args.save_after and total == args.save_after:
                torch.save({"loader": loader.state_dict(), "epoch": epoch}, state_path)
        steps.append(n)
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
                "planned": None,
            },
            f,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
