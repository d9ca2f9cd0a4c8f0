"""What the cheaper scoring forwards buy (``scoring_inference_mode``, ``scoring_precision``):
the scoring forward of a byte-level decoder of the single-pass language-model task's kind
(twice its default depth, width and context), timed side by side in its four variants, and
how far the lower precision moves the selection.

Measured: one scoring call as the loader makes it (the loader's own ``scoring_mode`` over
eval mode, no grad or inference mode, autocast or not, then the per-sequence losses), on the
same model and batch; the variants alternate call by call (a change of the machine's speed
moves them alike), after one untimed round each. Prints each variant's median and
[min, max] milliseconds and its ratio to ``no_grad`` in the model's precision, and, for the
lower precisions, how the selection moves: the rank correlation of the losses with
full precision's and the share of the same samples among the top half of losses (fixed
mode keeps the high-loss half in expectation at beta 1), on held-out windows of the task's
corpus (the running Python's standard library, ``tasks/lm_corpus.py``), after the model
trained a few steps on its training windows so that the losses mean something.

``python benchmarks/scoring_precision.py [--calls 40] [--layers 4 --d-model 256 --context 128 --batch 32]``
"""

import argparse
import json
import statistics

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach
import torch

from benchmarks.instruments.environment import versions
from benchmarks.instruments.options import CLOCKS
from benchmarks.tasks.lm_corpus import read_corpus, stream_order
from benchmarks.tasks.lm_model import ByteTransformer, LMShape, sequence_losses
from neuron_sift.scoring.forward import SCORING_DTYPES, scoring_mode

VARIANTS = (("no_grad", "model"), ("inference_mode", "model"), ("no_grad", "bfloat16"), ("inference_mode", "bfloat16"))


def score(model: torch.nn.Module, batch: torch.Tensor, grad_mode: str, precision: str) -> torch.Tensor:
    """One scoring call under the loader's context for this variant (on the CPU)."""
    inference = torch.inference_mode() if grad_mode == "inference_mode" else None
    autocast = None if precision == "model" else torch.autocast("cpu", dtype=SCORING_DTYPES[precision])
    with scoring_mode(model, inference, autocast):
        return sequence_losses(model, batch).float()


def train_briefly(model: torch.nn.Module, batches: list[torch.Tensor], steps: int) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        sequence_losses(model, batches[i % len(batches)]).mean().backward()
        opt.step()


def ranks(x: torch.Tensor) -> torch.Tensor:
    return torch.argsort(torch.argsort(x)).double()


def agreement(full: torch.Tensor, low: torch.Tensor) -> dict:
    """Spearman's rank correlation of two loss vectors and the overlap of their top halves."""
    a, b = ranks(full), ranks(low)
    rho = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    k = full.shape[0] // 2
    top_a, top_b = set(torch.topk(full, k).indices.tolist()), set(torch.topk(low, k).indices.tolist())
    return {"spearman": round(rho, 4), "top_half_same": round(len(top_a & top_b) / k, 4)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=40, help="timed calls per variant (alternating)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--train-steps", type=int, default=30, help="steps before the agreement is measured")
    p.add_argument("--heldout", type=int, default=256, help="held-out windows the agreement is measured on")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="cpu", help="cpu (default on the CPU) or wall")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = LMShape(layers=args.layers, d_model=args.d_model, heads=args.heads, context=args.context)
    model = ByteTransformer(shape)
    corpus = read_corpus(args.context, args.heldout)
    order = stream_order(corpus.train.shape[0], 0)
    batches = [corpus.train[order[i * args.batch : (i + 1) * args.batch]] for i in range(max(4, args.train_steps))]
    clock = CLOCKS[args.clock]
    times: dict[str, list[float]] = {f"{m}+{p_}": [] for m, p_ in VARIANTS}
    for grad_mode, precision in VARIANTS:  # one untimed round each
        score(model, batches[0], grad_mode, precision)
    for i in range(args.calls):
        batch = batches[i % len(batches)]
        for grad_mode, precision in VARIANTS:
            t0 = clock()
            score(model, batch, grad_mode, precision)
            times[f"{grad_mode}+{precision}"].append((clock() - t0) * 1e3)
    base = statistics.median(times["no_grad+model"])
    rows = {
        name: {
            "ms": round(statistics.median(v), 3),
            "min": round(min(v), 3),
            "max": round(max(v), 3),
            "vs_no_grad_fp32": round(statistics.median(v) / base, 3),
        }
        for name, v in times.items()
    }
    train_briefly(model, batches, args.train_steps)
    heldout = corpus.heldout
    chunks = range(0, heldout.shape[0], 64)
    full = torch.cat([score(model, heldout[i : i + 64], "no_grad", "model") for i in chunks])
    low = torch.cat([score(model, heldout[i : i + 64], "no_grad", "bfloat16") for i in chunks])
    out = {
        "model": shape.describe(),
        "corpus": {k: corpus.describe()[k] for k in ("corpus", "bytes", "sha256", "heldout_sequences")},
        "batch": args.batch,
        "clock": args.clock,
        "threads": args.threads,
        "calls": args.calls,
        "variants": rows,
        "bfloat16_selection": agreement(full, low),
        "versions": versions({}),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
