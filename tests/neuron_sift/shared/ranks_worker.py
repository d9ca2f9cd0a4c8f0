"""One rank of test_ranks.py's two-process run: each ``RankGroup`` collective on values of
its own; writes what it got to ``rank{r}.json``."""

import argparse
import json
import os

import torch
import torch.distributed as dist

from neuron_sift.shared.ranks import RankGroup
from tests.neuron_sift.torchrun import release_process_group


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    group = RankGroup(True, torch.device("cpu"))
    r = group.rank
    summed = group.sum(torch.tensor([[r, 1], [1, 1]], dtype=torch.int64))
    gathered = group.all_gather_rows(torch.tensor([[float(r), 10.0 * r]]))
    off = RankGroup(False, torch.device("cpu"))
    out = {
        "rank": r,
        "world_size": group.world_size,
        "active": group.active,
        "min": group.min_int(3 + r),
        "sum": summed.float().tolist(),
        "sum_dtype": str(summed.dtype),
        "gathered": gathered.tolist(),
        "disabled": [off.active, off.rank, off.world_size, off.min_int(7)],
        "received_bytes": [group.received_bytes, off.received_bytes],
    }
    with open(os.path.join(args.out, f"rank{r}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    release_process_group()


if __name__ == "__main__":
    main()
