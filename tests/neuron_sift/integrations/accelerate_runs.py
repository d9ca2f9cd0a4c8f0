"""accelerate runs of both sifting loaders, for ``test_accelerate_checkpoint.py``.

``python -m tests.neuron_sift.integrations.accelerate_runs MODES DIR`` (MODES: ``sifting``,
``epoch`` or both, comma-separated) trains, for each mode, three times in one process: uninterrupted; again, saving
``accelerator.save_state`` in the middle of the second epoch and at the first epoch's last
batch; and, for each save, a run built afresh (other initial weights) that calls
``accelerator.load_state`` and trains on. It prints one ``RESULTS {json}`` line.

A subprocess, because accelerate decides once per process, at import, whether to train on
torch-xla: ``USE_TORCH_XLA=0`` gives the CPU run, leaving it on (with ``PJRT_DEVICE=CPU``)
the XLA run.
"""

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader, RelativeProbabilisticSiftConfig, SiftingDataloader

N, B, EPOCHS = 100, 8, 3


class CrossEntropy:
    def loss(self, model, transformed_batch, original_batch=None):
        _ids, x, y = original_batch
        device = next(model.parameters()).device
        x, y = x.to(device), y.to(device)
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


class LoopPosition:
    """The loop's own state (the epoch it is in), registered for checkpointing beside the loader."""

    def __init__(self):
        self.epoch = 0

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]


class Run:
    """One training run as a user writes it with accelerate."""

    def __init__(self, mode, init_seed):
        self.mode = mode
        self.accelerator = Accelerator()
        torch.manual_seed(init_seed)
        model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.arange(N), torch.randn(N, 10, generator=g), torch.randint(0, 3, (N,), generator=g))
        # A sampler whose order depends only on its seed and epoch: the resumed epoch's order is the saved one's.
        source = DataLoader(data, batch_size=B, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=7))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.on_xla = self.accelerator.distributed_type == DistributedType.XLA
        self.mark_step = lambda: None
        if self.on_xla:
            import torch_xla

            self.mark_step = torch_xla.sync  # each step's graph; a prepared loader would mark it
            # accelerate's save_state fails on XLA once a DataLoader is prepared (it reads
            # ``.dataset`` of its MpDeviceLoaderWrapper, which has none): the source stays a
            # plain DataLoader, which one process on XLA needs no preparing for.
            self.model, self.opt = self.accelerator.prepare(model, opt)
            self.source = source
        else:
            self.model, self.opt, self.source = self.accelerator.prepare(model, opt, source)
        if mode == "sifting":
            config = RelativeProbabilisticSiftConfig(
                beta_value=1.0,
                loss_history_length=32,
                loss_based_sift_config={"sift_config": {"sift_delay": 2}},
                selection_mode="probabilistic",
                seed=5,
            )
            loader = SiftingDataloader(config, self.source, loss_impl=CrossEntropy(), model=self.model)
        else:
            loader = EpochSiftingDataloader(EpochSiftConfig(kept_share=0.5, warmup_epochs=1, seed=3), self.source, 3)
        self.loader = self.accelerator.prepare(loader)
        self.prepare_returned_the_loader = self.loader is loader
        self.position = LoopPosition()
        self.accelerator.register_for_checkpointing(self.loader, self.position)
        self.trained = []  # (epoch, sample ids) of every step

    def train(self, saves=None):
        """``saves``: {step: directory} to ``save_state`` into after that step."""
        saves = saves or {}
        for epoch in range(self.position.epoch, EPOCHS):
            self.position.epoch = epoch
            if self.mode == "sifting":
                # The prepared loader passes the epoch on to the sampler (and keeps it as its own).
                (self.source.sampler if self.on_xla else self.source).set_epoch(epoch)
            for ids, x, y in self.loader:
                x, y = x.to(self.accelerator.device), y.to(self.accelerator.device)
                per_sample = torch.nn.functional.cross_entropy(self.model(x), y, reduction="none")
                loss = self.loader.weighted_loss(per_sample) if self.mode == "epoch" else per_sample.mean()
                self.accelerator.backward(loss)
                self.opt.step()
                self.opt.zero_grad()
                self.mark_step()
                self.trained.append((epoch, ids.cpu().tolist()))
                if len(self.trained) in saves:
                    # On XLA accelerate's load_state cannot read safetensors into the device's
                    # model (safetensors asks for the device tensors' data pointers).
                    self.accelerator.save_state(saves[len(self.trained)], safe_serialization=not self.on_xla)
        self.position.epoch = EPOCHS

    def weights(self):
        return torch.cat([p.detach().cpu().flatten() for p in self.model.parameters()])


def main(modes, directory):
    print("RESULTS " + json.dumps({mode: results(mode, Path(directory) / mode) for mode in modes.split(",")}))


def results(mode, directory):
    full = Run(mode, init_seed=0)
    full.train()
    first_epoch = sum(1 for epoch, _ in full.trained if epoch == 0)
    saves = {first_epoch + 3: str(directory / "mid_epoch"), first_epoch: str(directory / "epoch_end")}
    saving = Run(mode, init_seed=0)
    saving.train(saves)
    resumed = {}
    for step, path in saves.items():
        run = Run(mode, init_seed=99)
        run.accelerator.load_state(path)
        run.train()
        resumed[Path(path).name] = {
            "step": step,
            "same_batches": run.trained == full.trained[step:],
            "same_weights": torch.equal(run.weights(), full.weights()),
            "max_weight_difference": (run.weights() - full.weights()).abs().max().item(),
            "first_batches": run.trained[:2],
            "expected_first_batches": full.trained[step : step + 2],
        }
    return {
        "distributed_type": str(full.accelerator.distributed_type),
        "device": str(full.accelerator.device),
        "source_type": type(full.source).__name__,
        "prepare_returned_the_loader": full.prepare_returned_the_loader,
        "steps": len(full.trained),
        "first_epoch": first_epoch,
        "saving_changed_nothing": saving.trained == full.trained and torch.equal(saving.weights(), full.weights()),
        "backend": type(full.loader.backend).__name__,
        "resumed": resumed,
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
