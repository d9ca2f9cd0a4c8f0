"""A stand-in for a ``transformers.Trainer`` in one process: what the integrations read of it
(its arguments, its accelerator's world, its own train loader) and the methods they patch,
so the decisions made at ``get_train_dataloader`` are tested without building a model or
starting processes. ``ParallelMode`` and ``DistributedType`` are the real enums."""

from types import SimpleNamespace

import torch
from accelerate.data_loader import BatchSamplerShard
from accelerate.utils import DistributedType
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset
from transformers.training_args import ParallelMode

SAMPLES = 32
BATCH = 4


def train_loader(shards=1, rank=0):
    """The Trainer's train loader over ``SAMPLES`` ids, as accelerate prepares it for ``shards``
    processes (a ``BatchSamplerShard`` when sharded), with a shuffling sampler."""
    data = TensorDataset(torch.arange(SAMPLES))
    sampler = BatchSampler(RandomSampler(data, generator=torch.Generator().manual_seed(0)), BATCH, drop_last=False)
    if shards > 1:
        sampler = BatchSamplerShard(sampler, num_processes=shards, process_index=rank)
    return DataLoader(data, batch_sampler=sampler)


class FakeTrainer:
    """``parallel_mode`` (a ``ParallelMode`` value), ``processes`` (the accelerator's
    ``num_processes``) and ``distributed_type`` (a ``DistributedType`` name) say how it trains;
    ``arguments`` override ``TrainingArguments`` fields."""

    def __init__(self, loader, parallel_mode="not_parallel", processes=1, distributed_type="NO", **arguments):
        self.loader = loader
        self.args = SimpleNamespace(
            parallel_mode=ParallelMode(parallel_mode),
            world_size=processes,
            num_train_epochs=4.0,
            max_steps=-1,
            gradient_accumulation_steps=1,
            output_dir="unused",
        )
        for name, value in arguments.items():
            setattr(self.args, name, value)
        self.accelerator = SimpleNamespace(num_processes=processes, distributed_type=DistributedType[distributed_type])
        self.model = torch.nn.Linear(1, 2)
        self.callbacks = []

    def get_train_dataloader(self):
        return self.loader

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        raise AssertionError("not called by these tests")

    def log(self, logs, *args, **kwargs):
        return None

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        return None

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def remove_callback(self, callback):
        self.callbacks.remove(callback)
