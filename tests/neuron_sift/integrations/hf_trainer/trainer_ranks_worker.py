"""One rank of Hugging Face Trainer runs under ``torchrun`` on CPU (gloo), launched by
test_ranks.py with ``USE_TORCH_XLA=0`` and no visible CUDA device.

Two situations a user meets with ``torchrun --nproc-per-node 2``:

- ``not_parallel``: ``TrainingArguments`` without ``use_cpu`` on a machine without an
  accelerator. accelerate initialises a gloo process group (``torch.distributed`` reports 2
  ranks) but trains with ``DistributedType.NO``: no DDP wrapper, no gradient all-reduce,
  every process training all the data (``ParallelMode.NOT_PARALLEL``).
- ``ddp``: ``use_cpu=True``. accelerate trains ``MULTI_CPU``: the train loader is sharded
  over the 2 processes and DDP averages the gradients (``ParallelMode.DISTRIBUTED``).

Each runs both sifting modes (``enable_epoch_sifting`` and ``enable_sifting``), all in one
process per rank: accelerate's state is rebuilt by every ``TrainingArguments`` while the
process group, once initialised, is reused. Writes ``rank{r}.json``: per run, what the
Trainer and ``torch.distributed`` said, the world the sifting loader coordinated over, the
dataset ids trained at each step (epoch mode) and the final weights.

    python -m torch.distributed.run --nproc_per_node=2 trainer_ranks_worker.py --out DIR
"""

import argparse
import json
import logging
import os
import tempfile

import torch
import torch.distributed as dist

from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting
from neuron_sift.integrations.trainer import enable_sifting
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import (
    SiftBertLoss,
    TinyTextClassifier,
    ToyTextDataset,
    TrainedIds,
    make_trainer,
    sift_config,
)
from tests.neuron_sift.torchrun import release_process_group

NOTICES = []  # the integration's warnings: whether the user was told what the run does


class Notices(logging.Handler):
    def emit(self, record):
        NOTICES.append(record.getMessage())


SAMPLES = 64  # batches of 8: 8 per epoch on one process, 4 per rank when sharded over 2
EPOCH_CONFIG = {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.25, "start_rank_correlation": None}


def trainer_for(situation, out, data):
    return make_trainer(
        out,
        model=TinyTextClassifier(),
        data=data,
        num_train_epochs=4,
        learning_rate=1e-2,
        logging_steps=500,
        use_cpu=situation == "ddp",
    )


def what_the_trainer_says(trainer):
    return {
        "parallel_mode": trainer.args.parallel_mode.value,
        "distributed_type": trainer.accelerator.distributed_type.name,
        "torch_world": dist.get_world_size() if dist.is_initialized() else 1,
        "ddp_wrapped": type(trainer.model_wrapped).__name__ == "DistributedDataParallel",
        "global_step": trainer.state.global_step,
        "weights": torch.cat([p.detach().flatten() for p in trainer.model.parameters()]).tolist(),
        "notices": list(NOTICES),
    }


def epoch_run(situation, out):
    NOTICES.clear()
    data = ToyTextDataset(n=SAMPLES)
    trained = TrainedIds(data)
    trainer = enable_epoch_sifting(trainer_for(situation, out, data), EPOCH_CONFIG, trained)
    trainer.train()
    loader = trainer.epoch_sifting_dataloader
    return {
        **what_the_trainer_says(trainer),
        "loader_world": loader.ranks.world_size,
        "steps": trained.steps,
        "kinds": [e["kind"] for e in loader.metrics()["epochs"]],
    }


def per_batch_run(situation, out):
    NOTICES.clear()
    trainer = trainer_for(situation, out, ToyTextDataset(n=SAMPLES))
    enable_sifting(trainer, sift_config("probabilistic", delay=0), SiftBertLoss())
    trainer.train()
    loader = trainer.sifting_dataloader
    return {
        **what_the_trainer_says(trainer),
        "loader_world": loader.ranks.world_size,
        "samples_seen": loader.counts.num_orig_samples_seen,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    logging.getLogger("neuron_sift.integrations.trainer_ranks").addHandler(Notices(logging.WARNING))
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for situation in ("not_parallel", "ddp"):
            results[f"epoch_{situation}"] = epoch_run(situation, out)
            results[f"per_batch_{situation}"] = per_batch_run(situation, out)
    rank = dist.get_rank()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    release_process_group()


if __name__ == "__main__":
    main()
