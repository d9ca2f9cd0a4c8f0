"""Writes data/v1_<mode>.pt: checkpoints in the version-1 layout (neuron_sift 0.2.0) and
what the uninterrupted run emitted after them. Run once with the 0.2.0 code on the path;
tests/neuron_sift/dataloader/test_state_dict.py loads them with today's code."""

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader


class Samples(Dataset):
    """Dict samples with a string field: the checkpoint's pending samples keep structure and types."""

    def __len__(self):
        return 90

    def __getitem__(self, i):
        return {"id": torch.tensor(i), "x": torch.full((3,), float(i)), "name": f"s{i}", "loss": (i * 37 % 101) / 101.0}


class ColumnLoss:
    def loss(self, model, transformed_batch, original_batch=None):
        return original_batch["loss"].float()


def make(mode, device="cpu"):
    config = RelativeProbabilisticSiftConfig(
        beta_value=1.5,
        loss_history_length=40,
        loss_based_sift_config={"sift_config": {"sift_delay": 2}},
        selection_mode=mode,
        seed=3,
    )
    return SiftingDataloader(
        config, DataLoader(Samples(), batch_size=8), loss_impl=ColumnLoss(), model=torch.nn.Linear(1, 1).to(device)
    )


def ids(batch):
    return batch["id"].tolist()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for mode in ("probabilistic", "fixed"):
        loader = make(mode)
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
        assert state["version"] == 1 and state["pending"] is not None
        rest = [ids(b) for b in it] + [ids(b) for b in loader]  # the rest of this epoch, then one more
        torch.save({"state": state, "rest": rest}, out / f"v1_{mode}.pt")
        print(mode, state["source_batches_consumed"], state["counts"]["num_samples_pending"], len(rest))
