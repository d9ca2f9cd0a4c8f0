"""Runs the per-batch engine on torch-xla's CPU device over the shapes that matter for
Neuron's limits and prints torch-xla's op counters as JSON; run with
``XLA_FLAGS=--xla_dump_to=DIR`` so every graph compiled is dumped as HLO text.

Both selection modes; batch sizes and histories from the small default up to 32768 (the
pairwise and the chunked-merge percentile); a short last batch every epoch; two epochs.
"""

import json

import torch
import torch_xla
import torch_xla.debug.metrics as met
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader

SHAPES = [(64, 128), (256, 4096), (32, 32768), (256, 32768)]  # (B, H)


class ColumnLoss:
    def loss(self, model, transformed_batch, original_batch=None):
        return original_batch[0][:, 0].abs()


def main() -> None:
    torch.set_num_threads(1)
    device = torch_xla.device()
    for mode in ("probabilistic", "fixed"):
        for b, h in SHAPES:
            n = 3 * b + b // 3  # a short last batch
            g = torch.Generator().manual_seed(b + h)
            data = TensorDataset(torch.rand(n, 4, generator=g), torch.arange(n))
            cfg = RelativeProbabilisticSiftConfig(
                beta_value=1.0,
                loss_history_length=h,
                selection_mode=mode,
                loss_based_sift_config={"sift_config": {"sift_delay": 0}},
                seed=0,
            )
            loader = SiftingDataloader(
                sift_config=cfg,
                orig_dataloader=DataLoader(data, batch_size=b),
                loss_impl=ColumnLoss(),
                model=torch.nn.Linear(1, 1).to(device),
            )
            for _ in range(2):
                for _batch in loader:
                    pass
    print(json.dumps({"counters": sorted(met.counter_names()), "shapes": SHAPES}))


if __name__ == "__main__":
    main()
