"""One rank of user_data/test_mds.py's two-rank test: ``StreamingDataset`` over MDS shards in one local
folder that both ranks share (Streaming's own shared-memory coordination on the node),
read by ``EpochSiftingDataloader`` under gloo.

Without ``--resume``: first a dataset with ``replication=2`` (refused: its message is
written), then a warm-up and a sifted epoch; per epoch the global plan, this rank's share
of it, the ids trained and the ids read out of the shards; the loader's state is saved
``CUT`` batches into the sifted epoch, and the run goes on to the epoch's end. With
``--resume``: a new job over a fresh copy of the compressed shards loads its rank's state
and trains the rest; it writes the ids trained and read, the shards they lie in and, on rank
0 once both ranks finished, the shards decompressed on the node. One JSON file per rank."""

import argparse
import json
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from streaming import StreamingDataset
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.epoch.format_sources import WIDTH, ShardReads, raw_shards, shards_of

BATCH, CUT = 8, 2
CONFIG = {"seed": 5, "kept_share": 0.5, "warmup_epochs": 1, "start_rank_correlation": None}  # prune from epoch 1


def train(loader, model, opt, after_batch=None):
    """The epoch (or its rest); ``after_batch(ids trained so far)`` runs after each step."""
    trained = []
    for batch in loader:
        trained += batch["id"].tolist()
        loss = loader.weighted_loss(F.cross_entropy(model(batch["x"]), batch["y"], reduction="none"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if after_batch is not None:
            after_batch(trained)
    return trained


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shards", required=True)  # not --local: torchrun would take it for its --local-addr
    p.add_argument("--replicated", default=None)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state_path = os.path.join(args.out, f"state_rank{rank}.pt")
    reads = ShardReads(os.path.join(args.out, f"reads_rank{rank}_{'resumed' if args.resume else 'run'}.log"))
    reads.install()
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    out: dict = {"rank": rank}
    if not args.resume:
        replicated = StreamingDataset(local=args.replicated, remote=None, batch_size=BATCH, replication=2)
        try:
            EpochSiftingDataloader(CONFIG, DataLoader(replicated, batch_size=BATCH), num_epochs=3)
            out["refused"] = ""
        except ValueError as exc:
            out["refused"] = str(exc)
    ds = StreamingDataset(local=args.shards, remote=None, batch_size=BATCH, shuffle=True)
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=3)
    if args.resume:
        loader.load_state_dict(torch.load(state_path, weights_only=True))
        reads.clear()
        rest = train(loader, model, opt)
        read = reads.ids(ds)
        out.update(rest=rest, reads=read, shards=sorted(shards_of(ds, read)))
        dist.barrier()  # both ranks have read all they will
        out.update(decompressed=sorted(raw_shards(args.shards)), all_shards=len(ds.shards))
    else:
        out.update(len=len(ds), size=int(ds.size), plans=[], kinds=[], mine=[], trained=[], reads=[])
        for _ in range(2):
            reads.clear()
            plan = loader.start_epoch()
            mine = np.concatenate(loader.planner.rank_batches_of(plan)).tolist()

            def checkpoint(ids, sifted=plan.kind == "sift"):
                if sifted and len(ids) == CUT * BATCH:  # a preemption here: the state, and what was trained
                    torch.save(loader.state_dict(), state_path)
                    out["first"] = list(ids)

            trained = train(loader, model, opt, checkpoint)
            out["plans"].append(plan.order.tolist())
            out["kinds"].append(plan.kind)
            out["mine"].append(mine)
            out["trained"].append(trained)
            out["reads"].append(reads.ids(ds))
    suffix = "_resumed" if args.resume else ""
    with open(os.path.join(args.out, f"rank{rank}{suffix}.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
