"""One rank of test_elastic.py: an epoch-level DDP run checkpointed in the middle of a sifted
epoch at one world size (``--phase save``) and resumed from every rank's checkpoint at
another (``--phase load``, ``EpochSiftingDataloader.load_state_dict_from_ranks``).

Writes ``{phase}_rank{r}.json``: the ids trained per epoch, steps per epoch, and each
epoch's plan (its order) as the loader holds it; the saving phase stops right after its
checkpoint, as a preempted job would."""

import argparse
import json
import os
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.torchrun import release_process_group

SAMPLES, BATCH, EPOCHS = 403, 8, 4  # warm-up, two sifted epochs, one annealing epoch
SAVE_IN_EPOCH, SAVE_AFTER = 1, 3  # the checkpoint: 3 batches into the first sifted epoch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--phase", choices=["save", "load"], required=True)
    p.add_argument("--saved-world", type=int, default=0, help="ranks of the run whose checkpoints are loaded")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    data = TensorDataset(torch.arange(SAMPLES), x, y)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    dl = DataLoader(data, batch_size=BATCH, shuffle=True)
    loader = EpochSiftingDataloader({"seed": 7, "kept_share": 0.5, "anneal_fraction": 0.25}, dl, num_epochs=EPOCHS)
    ckpt = os.path.join(args.out, "..", "ckpt")
    os.makedirs(ckpt, exist_ok=True)
    if args.phase == "load":
        net.load_state_dict(torch.load(os.path.join(ckpt, "model.pt"), weights_only=True))
        states = [
            torch.load(os.path.join(ckpt, f"loader_rank{r}.pt"), weights_only=True) for r in range(args.saved_world)
        ]
        loader.load_state_dict_from_ranks(states)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ids: dict[int, list[int]] = defaultdict(list)
    steps: dict[int, int] = defaultdict(int)
    plans: dict[int, list[int]] = {}
    saved = False
    while (loader.epoch < EPOCHS or loader.resuming) and not saved:
        for batch_ids, xb, yb in loader:
            e = loader.plan.epoch  # 0-based
            plans[e] = loader.plan.order.tolist()
            loss = loader.weighted_loss(F.cross_entropy(model(xb), yb, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            ids[e] += batch_ids.tolist()
            steps[e] += 1
            if args.phase == "save" and e == SAVE_IN_EPOCH and steps[e] == SAVE_AFTER:
                torch.save(loader.state_dict(), os.path.join(ckpt, f"loader_rank{rank}.pt"))
                if rank == 0:
                    torch.save(net.state_dict(), os.path.join(ckpt, "model.pt"))
                saved = True
                break
    params = torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()
    with open(os.path.join(args.out, f"{args.phase}_rank{rank}.json"), "w") as f:
        json.dump({"ids": ids, "steps": steps, "plans": plans, "params": params}, f)
    dist.barrier()
    del model
    release_process_group()


if __name__ == "__main__":
    main()
