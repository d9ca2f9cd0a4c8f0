"""One rank of ``score_dataset`` under torchrun (gloo, CPU), launched by test_score_dataset_ranks.py.

Each rank scores ``IdData(--samples)`` into ``--out/table`` and writes ``rank{r}.json``: the ids its
loss scored, in order, and the whole table's losses as it returned them (NaN as null).
"""

import argparse
import json
import math
import os

import torch.distributed as dist

from neuron_sift import score_dataset
from tests.neuron_sift.scoring.reference_helpers import IdData, RecordingLoss, reference_model
from tests.neuron_sift.torchrun import release_process_group


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loss = RecordingLoss()
    table = score_dataset(
        reference_model(),
        IdData(args.samples),
        loss,
        os.path.join(args.out, "table"),
        batch_size=args.batch_size,
        save_every=2,
        progress=rank == 0,
        description="two ranks",
    )
    out = {
        "scored": [i for ids in loss.ids for i in ids],
        "losses": [None if math.isnan(v) else v for v in table.losses().tolist()],
        "covered": table.covered,
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    release_process_group()


if __name__ == "__main__":
    main()
