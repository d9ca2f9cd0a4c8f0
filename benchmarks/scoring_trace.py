"""Host time of the scoring forward per source batch on torch-xla: traced per call (the
default) against ``TracedLoss`` (traced once per shape), side by side.

Measured: the host seconds of one ``loss_impl.loss`` call under the loader's scoring
context (eval, no grad), up to the point where the graph is cut (not the device's run),
then ``torch_xla.sync()`` and a wait outside the clock. The two variants alternate call by
call on the same model and batch, so a change of the machine's speed moves both alike.
Models: the suite's default MNIST-1D CNN (B = 256) and a small randomly initialised BERT
(2 layers, hidden 128, sequence 64, B = 32; transformers' BertForSequenceClassification,
nothing downloaded). Prints one JSON line per model: medians and [min, max] in ms.

``PJRT_DEVICE=CPU python benchmarks/scoring_trace.py [--calls 60]``
"""

import argparse
import json
import os
import statistics
import sys
import time

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach
import torch

from benchmarks.tasks.mnist1d import CNN1D
from neuron_sift import TracedLoss
from neuron_sift.scoring.forward import scoring_mode


class CE:
    def __init__(self, bert):
        self.bert = bert

    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        logits = model(input_ids=x).logits if self.bert else model(x)
        return torch.nn.functional.cross_entropy(logits, y, reduction="none")


def model_and_batch(name, device):
    torch.manual_seed(0)
    if name == "cnn":
        return CNN1D().to(device), (torch.randn(256, 40).to(device), torch.randint(0, 10, (256,)).to(device))
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=64,
    )
    model = BertForSequenceClassification(cfg).to(device)
    return model, (torch.randint(0, 1000, (32, 64)).to(device), torch.randint(0, 2, (32,)).to(device))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scoring_trace.py", description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=60, help="timed calls per variant (default 60)")
    p.add_argument("--models", default="cnn,bert", help="comma-separated subset of cnn,bert")
    args = p.parse_args(argv)
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch.set_num_threads(1)
    device = torch_xla.device()
    for name in args.models.split(","):
        model, batch = model_and_batch(name, device)
        variants: dict[str, CE | TracedLoss] = {
            "traced_per_call": CE(name == "bert"),
            "traced_once": TracedLoss(CE(name == "bert")),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        same = True
        for i in range(args.calls + 3):  # 3 warm-up calls (compilation)
            outs = {}
            for k, impl in variants.items():
                start = time.perf_counter()
                with scoring_mode(model):
                    outs[k] = impl.loss(model, None, batch)
                elapsed = time.perf_counter() - start
                torch_xla.sync()
                xm.wait_device_ops()
                if i >= 3:
                    times[k].append(elapsed)
            same &= torch.equal(outs["traced_per_call"].cpu(), outs["traced_once"].cpu())
        row = {"model": name, "batch_size": int(batch[0].shape[0]), "identical_losses": bool(same)}
        for k, v in times.items():
            row[f"{k}_ms"] = round(1e3 * statistics.median(v), 3)
            row[f"{k}_ms_range"] = [round(1e3 * min(v), 3), round(1e3 * max(v), 3)]
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
