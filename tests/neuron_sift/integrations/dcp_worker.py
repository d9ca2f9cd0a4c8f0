"""One rank of a run of both sifting loaders checkpointed with torch.distributed.checkpoint,
launched under torchrun (gloo) by test_distributed_checkpoint.py.

``--phase save``: each kind's run (``dcp_runs``) trains to its end, with a save after ``--stop``
steps (one count per kind) into ``--ckpt/<kind>``: ``dcp.async_save`` for the epoch loader,
with its own gloo group as docs/checkpoints.md shows (training goes on while it writes: the
future is awaited at the run's end), ``dcp.save`` for the others; the rank writes
``rank{r}.json``: every step's (epoch, ids), each epoch's plan (the epoch loader), the final
parameters.

``--phase load``: each loader's run is built afresh, loaded from that checkpoint through
``ReshardingLoadPlanner`` (at the saving world size or another) and trained to its end; the
rank writes ``rank{r}_resumed.json`` with the same fields, how many ranks' states
``load_state_dict_from_ranks`` got (None where it was not called), or the error a loader
refused the checkpoint with.
"""

import argparse
import json
import os
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from neuron_sift.integrations import ReshardingLoadPlanner
from tests.neuron_sift.integrations import dcp_runs
from tests.neuron_sift.torchrun import release_process_group

KINDS = ("epoch", "per-batch", "wrapped-epoch", "alone-epoch", "alone-per-batch")


class Recorder:
    """The epoch loader as the run sees it, noting what a resume at another world size got."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.from_ranks: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __iter__(self):
        return iter(self.inner)

    def load_state_dict_from_ranks(self, states) -> None:
        self.from_ranks = len(states)
        self.inner.load_state_dict_from_ranks(states)


def train(run: dcp_runs.Run, stop: int | None = None, checkpoint_id: str | None = None) -> dict[str, Any]:
    steps, plans, pending = [], {}, None
    for n, (epoch, ids) in enumerate(dcp_runs.training(run), start=1):
        steps.append([epoch, ids])
        if run.kind.endswith("epoch"):
            plans.setdefault(str(epoch), getattr(run.loader, "loader", run.loader).plan.order.tolist())
        if n == stop and run.kind == "epoch":  # the save's collectives in a group of their own, not DDP's
            saving = dist.new_group(backend="gloo")
            pending = dcp.async_save(dcp_runs.checkpoint_state(run), checkpoint_id=checkpoint_id, process_group=saving)
        elif n == stop:
            dcp.save(dcp_runs.checkpoint_state(run), checkpoint_id=checkpoint_id)
    if pending is not None:
        pending.result()
    return {"steps": steps, "plans": plans, "params": run.params.tolist()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["save", "load"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument(
        "--stop", type=int, nargs=len(KINDS), default=[0] * len(KINDS), help="save after this many steps, per kind"
    )
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out: dict[str, Any] = {}
    for kind, stop in zip(KINDS, args.stop):
        run = dcp_runs.build(kind)
        checkpoint_id = os.path.join(args.ckpt, kind)
        if args.phase == "save":
            out[kind] = train(run, stop, checkpoint_id)
        else:
            if kind in ("epoch", "wrapped-epoch"):
                run.loader = Recorder(run.loader)
            try:
                dcp_runs.restore(run, checkpoint_id, ReshardingLoadPlanner())
            except ValueError as refused:
                out[kind] = {"refused": str(refused)}
            else:
                out[kind] = {**train(run), "from_ranks": getattr(run.loader, "from_ranks", None)}
        dist.barrier()
        del run  # DDP holds the process group: see torchrun.release_process_group
    suffix = "" if args.phase == "save" else "_resumed"
    with open(os.path.join(args.out, f"rank{rank}{suffix}.json"), "w") as f:
        json.dump(out, f)
    release_process_group()


if __name__ == "__main__":
    main()
