"""One rank of resuming/test_elastic.py: an epoch-level DDP run checkpointed in the middle of a sifted
epoch at one world size (``--phase save``) and resumed from every rank's checkpoint at
another (``--phase load``, ``EpochSiftingDataloader.load_state_dict_from_ranks``).

Writes ``{phase}_rank{r}.json``: the ids trained per epoch, steps per epoch, each epoch's
plan (its order) as the loader holds it (under a sharded table: this rank's), the last loss
recorded for each id up to the checkpoint's epoch, with its epoch, the scores this rank holds when the epoch after the
checkpoint's starts (by id), and the largest tensor of its checkpoint; the saving phase
stops right after its checkpoint, as a preempted job would."""

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


def tensors(part: dict) -> list[torch.Tensor]:
    """Every tensor in a checkpoint part, nested dicts included."""
    out = []
    for value in part.values():
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, dict):
            out += tensors(value)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--phase", choices=["save", "load"], required=True)
    p.add_argument("--saved-world", type=int, default=0, help="ranks of the run whose checkpoints are loaded")
    p.add_argument("--score-table", choices=["replicated", "sharded"], default="replicated")
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
    config = {
        "seed": 7,
        "kept_share": 0.5,
        "anneal_fraction": 0.25,
        "score_table": args.score_table,
        "start_rank_correlation": None,
    }
    loader = EpochSiftingDataloader(config, dl, num_epochs=EPOCHS)
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
    last_loss: dict[int, tuple[int, float]] = {}
    held: dict[int, float] = {}
    largest = 0
    saved = False
    while (loader.epoch < EPOCHS or loader.resuming) and not saved:
        for batch_ids, xb, yb in loader:
            e = loader.plan.epoch  # 0-based
            plans[e] = loader.plan.order.tolist()
            if e == SAVE_IN_EPOCH + 1 and not held:  # the scores every later plan starts from, by id
                table = loader.tables.snapshot()
                owned = loader.planner.owner.ids() if args.score_table == "sharded" else range(SAMPLES)
                held = {int(i): float(table[slot]) for slot, i in enumerate(owned)}
            per_sample = F.cross_entropy(model(xb), yb, reduction="none")
            if e <= SAVE_IN_EPOCH:  # the losses the scores held at the next epoch's start come from
                last_loss.update({int(i): (e, float(v)) for i, v in zip(batch_ids, per_sample.detach())})
            loss = loader.weighted_loss(per_sample)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ids[e] += batch_ids.tolist()
            steps[e] += 1
            if args.phase == "save" and e == SAVE_IN_EPOCH and steps[e] == SAVE_AFTER:
                state = loader.state_dict()
                largest = max(t.numel() for part in state.values() if isinstance(part, dict) for t in tensors(part))
                torch.save(state, os.path.join(ckpt, f"loader_rank{rank}.pt"))
                if rank == 0:
                    torch.save(net.state_dict(), os.path.join(ckpt, "model.pt"))
                saved = True
                break
    params = torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()
    with open(os.path.join(args.out, f"{args.phase}_rank{rank}.json"), "w") as f:
        json.dump(
            {
                "ids": ids,
                "steps": steps,
                "plans": plans,
                "params": params,
                "last_loss": last_loss,
                "held": held,
                "largest_tensor": largest,
            },
            f,
        )
    dist.barrier()
    del model
    release_process_group()


if __name__ == "__main__":
    main()
