"""One rank of selection/test_quantiles.py's gloo run: summarises its own part of the scores over the
group and writes the merged summary and the bytes it gathered to ``rank{r}.json``."""

import argparse
import json
import os

import torch
import torch.distributed as dist

from neuron_sift.epoch.selection.quantiles import summarize_over_ranks
from neuron_sift.shared.ranks import RankGroup
from tests.neuron_sift.epoch.selection.test_quantiles import worker_scores
from tests.neuron_sift.torchrun import release_process_group


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    group = RankGroup(True, torch.device("cpu"))
    mine = worker_scores(group.world_size)[group.rank]
    summary = summarize_over_ranks(mine, group, knots=16)
    out = {
        "values": summary.values.tolist(),
        "weights": summary.weights.tolist(),
        "count": summary.count,
        "total": summary.total,
        "uncertain": summary.uncertain,
        "bytes": group.received_bytes,
    }
    with open(os.path.join(args.out, f"rank{group.rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    release_process_group()


if __name__ == "__main__":
    main()
