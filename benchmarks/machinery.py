"""What does the sifting machinery itself cost, per source batch, against a training step?

Machinery: everything ``SiftingDataloader`` does per source batch except the user's
scoring forward: the transform, ranking against the loss history, the draw, the history
update, the gather of kept rows and the accumulation into full batches. Measured as

    (wall-clock of one epoch through the SiftingDataloader
     - wall-clock of the same epoch through the plain source DataLoader, calling the same
       loss on every batch) / source batches

with a "loss" that is a column of the batch (no model), after a warm-up epoch (on XLA the
warm-up compiles every graph; the timed epochs compile nothing, and the record says so).
On XLA the clock is read after ``wait_device_ops``, so device time counts. The host-side
phase timings of ``loader.metrics()["machinery_seconds"]`` are recorded too.

It is set against one training step (forward, backward, Adam) of the suite's default model
(the MNIST-1D 1-D CNN) at the same batch size on the same backend: ``share`` = machinery /
step. Steps, sifted epochs and plain epochs are interleaved (each repeat times all three),
so a change of machine speed during the run moves numerator and denominator together:
each repeat's machinery is its sifted epoch minus the plain epoch right after it, its
share that over the step timed just before; medians over the repeats are reported.

Engines compared (``--engines``):
- ``pairwise``: the torch step with the B x H comparison (``percentile_rank``): the first
  implementation;
- ``torch``: the torch step as it runs on CUDA and XLA (``percentile_rank_auto``: the
  sort-based kernel from B x H >= 65536); on XLA traced once (``backends/xla_pure.py``);
- ``retrace``: on XLA only, the ``torch`` engine with the step traced anew for every
  source batch (the XLA path before the step was traced once);
- ``host``: the host step (C kernels) the eager backend runs on the CPU (``engine/cpu_step.py``);
  eager only.

``python benchmarks/machinery.py --help`` for the options.
"""

import argparse
import gc
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach

from benchmarks.instruments.environment import versions
from benchmarks.instruments.options import CLOCKS, add_clock, add_threads, use_threads
from benchmarks.studies.machinery_cost import (
    EAGER_ONLY,
    ENGINES,
    RUN_ORDER,
    XLA_ONLY,
    TrainStep,
    backend_setup,
    machinery_interleaved,
    machinery_seconds,
    machinery_table,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="machinery.py",
        description="Time of the sifting machinery per source batch (everything but the user's scoring forward) "
        "as a share of one training step of the default model (MNIST-1D CNN), for a grid of batch sizes and "
        "history lengths, on eager CPU and torch-xla, with the pairwise and the sort-based percentile kernel.",
    )
    p.add_argument("--batch-sizes", default="32,256,1024", help="comma-separated (default 32,256,1024)")
    p.add_argument("--histories", default="500,4096,32768", help="comma-separated (default 500,4096,32768)")
    p.add_argument("--backends", default="eager,xla", help="comma-separated subset of eager,xla (default both)")
    p.add_argument(
        "--engines",
        default="pairwise,torch,retrace,host",
        help="comma-separated subset of pairwise,torch,retrace,host (default all; host runs on eager only, "
        "retrace on xla only)",
    )
    p.add_argument(
        "--mode",
        choices=("probabilistic", "fixed"),
        default="probabilistic",
        help="selection mode (default probabilistic)",
    )
    p.add_argument("--batches", type=int, default=32, help="source batches per timed epoch (default 32)")
    p.add_argument("--repeats", type=int, default=9, help="timed repeats; medians are taken (default 9)")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="time the engines' repeats interleaved (before/after comparisons on a noisy machine)",
    )
    add_clock(p, help="wall-clock (default) or the process's CPU time (steadier on a shared machine)")
    add_threads(p, help="torch intra-op threads (default 1; 0: torch's default)")
    p.add_argument("--json", type=Path, help=f"JSON lines file to append to (default {DEFAULT_OUT}/machinery.jsonl)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)

    def ints(s, name):
        try:
            v = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            p.error(f"--{name} must be comma-separated integers")
        if not v or min(v) < 1:
            p.error(f"--{name}: positive integers")
        return v

    args.batch_sizes = ints(args.batch_sizes, "batch-sizes")
    args.histories = ints(args.histories, "histories")
    args.backends = [s.strip() for s in args.backends.split(",") if s.strip()]
    if not args.backends or any(b not in ("eager", "xla") for b in args.backends):
        p.error("--backends: eager and/or xla")
    args.engines = [s.strip() for s in args.engines.split(",") if s.strip()]
    if not args.engines or any(k not in ENGINES for k in args.engines):
        p.error("--engines: a subset of pairwise, torch, retrace, host")
    if args.batches < 2 or args.repeats < 1:
        p.error("--batches must be >= 2 and --repeats >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    clock = CLOCKS[args.clock]
    use_threads(args.threads)
    json_path = args.json or DEFAULT_OUT / "machinery.jsonl"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    setups = {name: backend_setup(name) for name in ("xla",) if name in args.backends}  # XLA device first
    if "eager" in args.backends:
        setups["eager"] = backend_setup("eager")
    vers = versions({"torch_xla": sys.modules["torch_xla"].__version__} if "xla" in setups else {})
    rows = []
    for backend in args.backends:
        device, wait = setups[backend]
        # Cheapest first: the pairwise kernel's B x H temporaries (large at the biggest B and H)
        # leave the allocator in a state that slows whatever runs after it in the same process.
        skip = EAGER_ONLY if backend == "xla" else XLA_ONLY
        engines = [e for e in RUN_ORDER if e in args.engines and e not in skip]
        for b in args.batch_sizes:
            train_step = TrainStep(b, device, wait, clock)
            for h in args.histories:
                row = {"backend": backend, "batch_size": b, "history": h}
                steps = []
                if args.interleave:
                    results = machinery_interleaved(
                        b, h, args.mode, engines, device, wait, args.batches, args.repeats, train_step, clock
                    )
                for engine in engines:
                    if args.interleave:
                        wall, host, new_compiles, step, share, spread = results[engine]
                    else:
                        wall, host, new_compiles, step, share, spread = machinery_seconds(
                            b, h, args.mode, engine, device, wait, args.batches, args.repeats, train_step, clock
                        )
                    steps.append(step)
                    gc.collect()
                    row[f"{engine}_ms"] = round(1e3 * wall, 3)
                    row[f"{engine}_ms_range"] = [round(1e3 * v, 3) for v in spread]
                    row[f"{engine}_host_ms"] = round(1e3 * host, 3)
                    row[f"{engine}_step_ms"] = round(1e3 * step, 3)
                    row[f"{engine}_share"] = round(max(share, 0.0), 4)
                    row[f"{engine}_compiles_after_warmup"] = new_compiles
                row["step_ms"] = round(1e3 * statistics.median(steps), 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(json_path, "a", encoding="utf-8") as f:
                    f.write(
                        json.dumps(
                            {
                                "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "versions": vers,
                                "device": str(device),
                                "config": {
                                    "mode": args.mode,
                                    "batches": args.batches,
                                    "repeats": args.repeats,
                                    "interleave": args.interleave,
                                    "clock": args.clock,
                                },
                                "results": row,
                            }
                        )
                        + "\n"
                    )
    print()
    print(machinery_table(rows, args.engines, args.markdown))
    print(f"\nrecords: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
