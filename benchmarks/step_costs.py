"""Where can per-batch sifting pay? The cost terms of its cost model, per task's model.

Per-batch sifting spends a no-grad scoring forward on every sample and saves the training
forward and the backward of the samples it drops: whether that pays depends on the ratio
of a training step's backward (with the optimizer step) to its forward, and on the scoring
forward's share of a step. This measures both, on the suite's tasks' models (``--task``,
the suite's names: their data, batch size and learning rate) and on the single-pass
language-model task's decoder (``lm``, the shape of its default run), with the same probe
the language-model task records in every run (``tasks/lm_model.cost_probe``: the medians of
5 rounds over 4 batches after an untimed round; a throwaway model, Adam).

``python benchmarks/step_costs.py [--task bert,mnist1d,lm] [--clock cpu] [--threads 1]
[--backend eager]`` prints one JSON line per task; on an accelerator (``--backend cuda``,
``cuda-compiled``, ``xla``) give ``--clock wall`` (the device's work is not the host's CPU
time; ``benchmarks/device_run.sh`` does).
"""

import argparse
import json
from typing import Any

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach
import torch

from benchmarks.core.lm_context import LMConfig
from benchmarks.core.task_costs import BATCHES, probe_on_backend, task_cost_probe
from benchmarks.instruments.environment import setup_backend, versions
from benchmarks.instruments.options import CLOCKS, add_backend, check_backend
from benchmarks.tasks.lm_corpus import read_corpus
from benchmarks.tasks.lm_model import ByteTransformer
from benchmarks.tasks.registry import TASKS, make_data, model_description


def task_costs(name: str, clock: str, backend: dict[str, Any]) -> dict:
    """The probe on a suite task's model, batch size and learning rate, on its first batches."""
    task = TASKS[name]
    probe = task_cost_probe(task, make_data(task, cache=None), backend, clock)
    probe.pop("clock")
    return {"task": name, "model": model_description(task), "batch": task.batch_size, **probe}


def lm_costs(clock: str, backend: dict[str, Any]) -> dict:
    """The probe on the language-model task's default decoder and batch (its runs record the same)."""
    config = LMConfig()
    corpus = read_corpus(config.shape.context, heldout_sequences=1)
    b = config.batch_size
    batches = [corpus.train[i * b : (i + 1) * b] for i in range(BATCHES)]
    probe = probe_on_backend(lambda: ByteTransformer(config.shape), batches, config.lr, backend, clock)
    return {"task": "lm", "model": config.shape.describe(), "batch": b, **probe}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="bert,mnist1d,lm", help=f"comma-separated: {', '.join(TASKS)} or lm")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="cpu", help="cpu (default) or wall")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the suite)")
    add_backend(p)
    args = p.parse_args(argv)
    check_backend(p, args)
    names = [t for t in args.task.split(",") if t]
    unknown = [t for t in names if t != "lm" and t not in TASKS]
    if unknown or not names:
        p.error(f"--task: unknown {unknown}; choose from {', '.join(TASKS)} or lm")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    backend = setup_backend(args.backend, args.compile_backend)
    out = []
    for name in names:
        row = lm_costs(args.clock, backend) if name == "lm" else task_costs(name, args.clock, backend)
        row.update(
            clock=args.clock,
            threads=args.threads,
            backend=backend["name"],
            device=backend["device_desc"],
            versions=versions(backend),
        )
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


if __name__ == "__main__":
    main()
