#!/usr/bin/env python
"""Does per-batch sifting reach a language model's held-out loss sooner than training on
everything? The single-pass language-model task (command line).

A byte-level decoder-only transformer (``tasks/lm_model.py``) trains one pass over the
running Python's standard library source (``tasks/lm_corpus.py``: the rule, the held-out
split by file, the size and SHA-256 in every record). As in pretraining, compute is the
limit, not data: every arm takes the same optimizer steps; an arm that skips samples reads
further into the stream for them. ``--corpus web`` trains on the web-like stream instead
(``tasks/lm_web.py``: the same clean training windows, mixed with repeated licence texts and
binary junk at fixed shares), judged on the same held-out clean source. Arms
(``arms/single_pass.py``, ``arms/selective_backprop.py``): the full-data frontier
(``lm-full`` and ``lm-full@0.4/0.6/0.8``, each schedule ended at its own end),
``lm-sift-probabilistic`` / ``lm-sift-fixed`` (``SiftingDataloader``) at beta 1 and 2
(``-b2``), ``lm-uniform`` at the same kept shares, and ``lm-selective-backprop``
(Composer's rule). The epoch-level arms do not apply.

The metric: held-out loss in bits per byte (lower is better); the target: ``lm-full``'s
final held-out loss plus ``--tolerance`` (default 0.02 bits per byte: a fixed held-out set
makes the evaluation itself exact, so the tolerance only has to absorb the last steps of a
still-falling curve: it is meant to be well under the gap between ``lm-full@0.8`` and
``lm-full``, so that a run reaching it has matched more than a shortened full run). Tables (``report/lm_summary.py``):
speedups to the target per seed, held-out loss, and the cost accounting: forward and
backward samples, seconds per part (training step, scoring forward, sifting machinery,
data path), and the speedup the cost model predicts beside the measured one.

Backends: ``eager`` (CPU, one torch thread: the CPU clock), ``cuda`` and ``cuda-compiled``
(one GPU, eager or ``torch.compile``; the wall clock, read after ``torch.cuda.synchronize()``),
``xla`` (torch-xla: ``PJRT_DEVICE=CPU`` unless set; ``PJRT_DEVICE=NEURON`` on Trainium).
``benchmarks/device_run.sh`` runs it on one GPU with 3 seeds.

The default size (200 steps of 32 windows of 64 bytes, a 2-layer d-128 model, 16
evaluations) is chosen so that 3 seeds of the default arms take about a quarter of an hour
of one CPU core; on a shared machine, one process per seed (``--seeds 0``, ``--seeds 1``, ...
each with its own ``--out``) and ``--summarize`` over their ``runs.jsonl`` files gives the
same tables, the times being each process's own CPU time.
"""

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach

from benchmarks.arms import default_arms, get_arm, task_arms
from benchmarks.core.lm_context import LMConfig
from benchmarks.core.lm_runner import run_lm_task
from benchmarks.instruments.environment import setup_backend, versions
from benchmarks.instruments.options import (
    add_backend,
    add_clock,
    add_threads,
    check_backend,
    default_clock,
    use_threads,
)
from benchmarks.instruments.records import read_records, write_summary
from benchmarks.report.lm_summary import format_lm_tables, summarize_lm
from benchmarks.tasks.lm_corpus import read_corpus
from benchmarks.tasks.lm_model import LMShape
from benchmarks.tasks.lm_web import read_web_corpus

DEFAULT_RESULTS = Path(__file__).resolve().parent / "results" / "lm"
TINY = {
    "steps": 12,
    "batch_size": 8,
    "evals": 3,
    "heldout_sequences": 16,
    "sift_delay": 1,
    "history": 64,
    "reference_steps": 4,
}
TINY_SHAPE = {"layers": 1, "d_model": 32, "heads": 2, "context": 16}
SIZES = (
    "steps",
    "batch_size",
    "evals",
    "heldout_sequences",
    "sift_delay",
    "history",
    "reference_steps",
    "lr",
    "tolerance",
)
SHAPES = ("layers", "d_model", "heads", "context")
CORPORA = {"clean": read_corpus, "web": read_web_corpus}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    base, shape = LMConfig(), LMShape()
    p = argparse.ArgumentParser(prog="lm_suite.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (default 0,1,2)")
    p.add_argument(
        "--arms",
        default=",".join(default_arms(single_pass=True)),
        help=f"comma-separated arms, lm-full among them; registered: {', '.join(task_arms(True))}",
    )
    for name in SIZES:
        kind = float if name in ("lr", "tolerance") else int
        p.add_argument(
            f"--{name.replace('_', '-')}", type=kind, default=getattr(base, name), help="(default %(default)s)"
        )
    for name in SHAPES:
        p.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(shape, name), help="(default %(default)s)"
        )
    p.add_argument(
        "--corpus",
        choices=sorted(CORPORA),
        default="clean",
        help="training stream: clean (the stdlib's source) or web (it mixed with licence texts and binary junk, "
        "tasks/lm_web.py); the held-out metric is the same (default %(default)s)",
    )
    add_backend(p)
    add_clock(
        p, help="cpu (default on the host's CPU) or wall (default on an accelerator); both recorded", default=None
    )
    add_threads(p, help="torch intra-op threads (default 1; 0: torch's default)")
    p.add_argument("--tiny", action="store_true", help="seconds-long sizes (for tests)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help=f"output folder (default {DEFAULT_RESULTS})")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        metavar="JSONL",
        help="only the tables, from existing runs files (several: e.g. one process per seed, run side by side)",
    )
    args = p.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error("--seeds must be comma-separated integers")
    args.arms = list(dict.fromkeys(a.strip() for a in args.arms.split(",") if a.strip()))
    for a in args.arms:
        try:
            if not get_arm(a).single_pass:
                p.error(f"--arms: {a} is not an arm of the single-pass LM task")
        except KeyError:
            p.error(f"--arms: unknown arm {a!r}; choose from {', '.join(task_arms(True))}")
    if "lm-full" not in args.arms or not args.seeds:
        p.error("--arms must include lm-full (the target is its held-out loss) and --seeds at least one seed")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    check_backend(p, args)
    sizes = {k: getattr(args, k) for k in SIZES}
    shape_args = {k: getattr(args, k) for k in SHAPES}
    if args.tiny:
        sizes.update(TINY)
        shape_args.update(TINY_SHAPE)
    try:
        args.config = LMConfig(shape=LMShape(**shape_args), **sizes)
    except ValueError as e:
        p.error(str(e))
    return args


def report(records: list[dict], out: Path) -> None:
    rows = summarize_lm(records)
    write_summary(rows, out / "summary.jsonl")
    print(format_lm_tables(rows))
    print(
        "reached: seeds whose held-out loss reached the target and stayed at or below it; speedups: lm-full's "
        "(or the fastest frontier run's) time to the target / the arm's, median [min, max] over the seeds that "
        "reached it; predicted: from lm-full's measured parts and the arm's sample counts (report/lm_summary.py)."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        missing = [str(f) for f in args.summarize if not f.is_file()]
        if missing:
            raise SystemExit(f"lm_suite.py --summarize: no such file: {', '.join(missing)}")
        report([r for f in args.summarize for r in read_records(f)], args.out)
        return 0
    use_threads(args.threads)
    backend = setup_backend(args.backend, args.compile_backend)
    vers = versions(backend)
    clock = args.clock or default_clock([backend["device_desc"]])
    config: LMConfig = args.config
    t0 = time.perf_counter()
    corpus = CORPORA[args.corpus](config.shape.context, config.heldout_sequences)
    described = corpus.describe()
    print(
        f"lm: corpus {described['name']}, {described['files']} files, {described['bytes']} bytes, "
        f"sha256 {described['sha256'][:16]}..., {described['train_sequences']} training windows, "
        f"{described['heldout_sequences']} held out, {described['reference_sequences']} reference "
        f"(read in {time.perf_counter() - t0:.1f} s); {config.steps} steps of batch {config.batch_size}; "
        f"{config.shape.describe()}; backend {args.backend} ({backend['device_desc']}), "
        f"{vers['torch_threads']} thread(s); seeds {args.seeds}; times on the {clock} clock",
        flush=True,
    )
    run_config = {
        **asdict(config),
        "model": config.shape.describe(),
        "corpus": described,
        "corpus_option": args.corpus,
        "arms": args.arms,
        "seeds": args.seeds,
        "tiny": args.tiny,
        "optimizer": f"Adam lr={config.lr}, warm-up {config.warmup} then cosine decay to 0 at the arm's own end",
    }
    arms = {name: get_arm(name).fn for name in args.arms}
    json_path = args.out / "runs.jsonl"
    started = time.perf_counter()
    records = run_lm_task(config, corpus, arms, args.seeds, backend, vers, run_config, json_path, clock, args.progress)
    print(f"\n{len(records)} runs in {time.perf_counter() - started:.0f} s; records: {json_path}\n", flush=True)
    report(records, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
