"""A small training run of either sifting loader checkpointed with torch.distributed.checkpoint,
shared by test_distributed_checkpoint.py (one process) and dcp_worker.py (under torchrun).

The checkpoint is DCP's own recipe: the model and optimizer through ``get_state_dict`` /
``set_state_dict`` (the optimizer's state keyed by parameter name, DDP's ``module.`` prefix
left out), the loader through ``PerRankLoaderState``, the per-batch loop's epoch as a plain
value.

Kinds: ``epoch`` and ``per-batch`` (the loaders sharing their work over the ranks),
``wrapped-epoch`` (``ExactLengthLoader`` around the epoch loader, as Lightning's users train),
and ``alone-epoch`` / ``alone-per-batch`` (built with ``distributed=False`` under DDP, each over
its rank's half of the data: docs/data-parallel.md's opt-out, the per-batch loader in fixed
mode so every rank takes the same steps)."""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from neuron_sift import EpochSiftingDataloader, Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations import ExactLengthLoader, PerRankLoaderState

SAMPLES, BATCH, EPOCHS = 96, 8, 3


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(torch.arange(SAMPLES), x, (x[:, 0] + x[:, 1] > 0).long())


class SiftLoss(Loss):
    """The per-batch loader's scoring loss, on the plain module."""

    def loss(self, model, transformed_batch, original_batch=None):
        _ids, x, y = original_batch
        return F.cross_entropy(model(x), y, reduction="none")


@dataclass
class Run:
    kind: str  # "epoch" or "per-batch"
    model: Any
    optimizer: torch.optim.Optimizer
    loader: Any
    sampler: DistributedSampler | None = None
    epoch: int = 0  # the per-batch loop's epoch

    @property
    def params(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()])


def build(kind: str) -> Run:
    """What a script builds at every start, before loading any checkpoint."""
    data = dataset()
    torch.manual_seed(0)  # the same initial weights on every rank
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = DistributedDataParallel(net) if dist.is_initialized() else net
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    alone = kind.startswith("alone-")
    if alone:  # this rank's half of the data, sifted on its own
        data = Subset(data, range(rank, SAMPLES, world))
    if kind.endswith("epoch"):
        config = {"seed": 7, "kept_share": 0.5, "anneal_fraction": 0.34, "start_rank_correlation": None}
        loader: Any = EpochSiftingDataloader(
            config,
            DataLoader(data, batch_size=BATCH, shuffle=True),
            num_epochs=EPOCHS,
            distributed=False if alone else None,
        )
        if kind == "wrapped-epoch":
            loader = ExactLengthLoader(loader, epochs=EPOCHS)
        return Run(kind, model, optimizer, loader)
    replicas = 1 if alone else world
    sampler = DistributedSampler(data, num_replicas=replicas, rank=0 if alone else rank, shuffle=True, seed=3)
    config = RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=32,
        loss_based_sift_config={"sift_config": {"sift_delay": 2}},
        selection_mode="fixed" if alone else "probabilistic",
        seed=0,
    )
    loader = SiftingDataloader(
        sift_config=config,
        orig_dataloader=DataLoader(data, batch_size=BATCH, sampler=sampler),
        loss_impl=SiftLoss(),
        model=net,
        distributed=False if alone else None,
    )
    return Run(kind, model, optimizer, loader, sampler)


def _step(run: Run, loss: torch.Tensor) -> None:
    run.optimizer.zero_grad()
    loss.backward()
    run.optimizer.step()


def training(run: Run):
    """The run's loop, yielding (epoch, ids) after every optimizer step, so that a caller can
    checkpoint between steps and go on."""
    if run.kind == "wrapped-epoch":
        stream, loader = run.loader, run.loader.loader
        for epoch in range(run.epoch, EPOCHS):
            run.epoch = epoch
            stream.set_epoch(epoch)
            for ids, x, y in stream:
                _step(run, loader.weighted_loss(F.cross_entropy(run.model(x), y, reduction="none")))
                yield loader.plan.epoch, ids.tolist()
        return
    if run.kind.endswith("epoch"):
        loader = run.loader
        while loader.epoch < EPOCHS or loader.resuming:
            for ids, x, y in loader:
                _step(run, loader.weighted_loss(F.cross_entropy(run.model(x), y, reduction="none")))
                yield loader.plan.epoch, ids.tolist()
        return
    assert run.sampler is not None
    for epoch in range(run.epoch, EPOCHS):
        run.epoch = epoch
        run.sampler.set_epoch(epoch)
        for ids, x, y in run.loader:
            _step(run, F.cross_entropy(run.model(x), y))
            yield epoch, ids.tolist()


def checkpoint_state(run: Run) -> dict[str, Any]:
    """The DCP state dict of the run: model, optimizer, loader, the per-batch loop's epoch."""
    model_state, optim_state = get_state_dict(run.model, run.optimizer)
    return {"model": model_state, "optim": optim_state, "loader": PerRankLoaderState(run.loader), "epoch": run.epoch}


def restore(run: Run, checkpoint_id: str, planner: Any = None) -> None:
    """Load the checkpoint into the freshly built ``run``."""
    state = checkpoint_state(run)
    dcp.load(state, checkpoint_id=checkpoint_id, planner=planner)
    set_state_dict(run.model, run.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    run.epoch = state["epoch"]
