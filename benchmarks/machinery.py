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
import os
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from neuron_sift.kernels.percentile import percentile_rank, percentile_rank_auto  # noqa: E402

import neuron_sift.engine.step as step_module  # noqa: E402
from environment import versions  # noqa: E402  (benchmarks/ is not a package)
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader  # noqa: E402
from neuron_sift.engine.sifter import Sifter  # noqa: E402
from neuron_sift.sift_config.sift_configs import RelativeProbabilisticSiftConfig  # noqa: E402
from options import CLOCKS, add_clock, add_threads, use_threads  # noqa: E402
from tasks import CNN1D  # noqa: E402


def pairwise_rank(
    losses: torch.Tensor,
    history: torch.Tensor,
    fill: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    method: str = "search",
) -> torch.Tensor:
    """The pairwise kernel in the place of ``percentile_rank_auto``: it sorts nothing, so the
    sort method the step passes does not apply to it."""
    return percentile_rank(losses, history, fill, slots)


# engine -> (runs the host step, percentile kernel of the torch step, XLA: traced once)
ENGINES = {
    "pairwise": (False, pairwise_rank, True),
    "torch": (False, percentile_rank_auto, True),
    "retrace": (False, percentile_rank_auto, False),
    "host": (True, None, True),
}
RUN_ORDER = ("host", "torch", "retrace", "pairwise")
XLA_ONLY, EAGER_ONLY = ("retrace",), ("host",)
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
CLOCK = CLOCKS["wall"]  # --clock


class ColumnLoss:
    """A free 'loss': the first feature of each sample (no model forward)."""

    def loss(self, model, transformed_batch, original_batch=None):
        return original_batch[0][:, 0].abs()


def backend_setup(name):
    if name == "eager":
        return torch.device("cpu"), (lambda: None)
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla.device()

    def wait():
        torch_xla.sync()
        xm.wait_device_ops()

    return device, wait


def compiles():
    if "torch_xla" not in sys.modules:
        return 0
    from neuron_sift.backends.xla import xla_compile_count

    return xla_compile_count()


class TrainStep:
    """One training step (forward, backward, Adam) of the default model at batch size b."""

    def __init__(self, b, device, wait):
        torch.manual_seed(0)
        self.model = CNN1D().to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(b, 40).to(device)
        self.y = torch.randint(0, 10, (b,)).to(device)
        self.wait = wait
        self.seconds(3)  # warm-up (and, on XLA, compilation)

    def seconds(self, reps):
        """Median seconds of ``reps`` steps."""
        times = []
        for _ in range(reps):
            start = CLOCK()
            self.opt.zero_grad(set_to_none=True)
            F.cross_entropy(self.model(self.x), self.y).backward()
            self.opt.step()
            self.wait()
            times.append(CLOCK() - start)
        return statistics.median(times)


class _Arm:
    """One engine's loader over the benchmark's data: a warm-up epoch, then timed repeats."""

    def __init__(self, b, h, mode, engine, device, wait, batches):
        host_step, self.kernel, trace_once = ENGINES[engine]
        self.device, self.wait, self.batches = device, wait, batches
        n = b * batches
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.rand(n, 40, generator=g), torch.randint(0, 10, (n,), generator=g), torch.arange(n)
        )
        self.b = b
        self.model = torch.nn.Linear(1, 1).to(device)  # only tells the loader the device
        config = RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=h,
            selection_mode=mode,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            seed=0,
        )
        self.user_loss = ColumnLoss()
        self.loader = SiftingDataloader(
            sift_config=config, orig_dataloader=self.source(), loss_impl=self.user_loss, model=self.model
        )
        self.loader.sifter = Sifter(config, self.loader.backend, self.loader.ranks, host_step=host_step)
        if not trace_once:
            self.loader.backend.trace_once = False
        self.sift_times, self.plain_times, self.host = [], [], 0.0
        self._epoch()  # warm-up epoch: compiles every graph on XLA

    def source(self):
        return DataLoader(self.data, batch_size=self.b, shuffle=True, generator=torch.Generator().manual_seed(1))

    def _epoch(self):
        if self.kernel is not None:
            step_module.percentile_rank_auto = self.kernel
        try:
            for _ in self.loader:
                pass
            self.wait()
        finally:
            step_module.percentile_rank_auto = percentile_rank_auto

    def repeat(self):
        """One sifted epoch and the plain epoch right after it."""
        before = self.loader.machinery_seconds
        start = CLOCK()
        self._epoch()
        self.sift_times.append(CLOCK() - start)
        self.host += self.loader.machinery_seconds - before
        start = CLOCK()
        for batch in self.source():  # the same epoch without sifting: loading, the move to the device, the loss
            moved = [t.to(self.device) for t in batch]
            with torch.no_grad():
                self.user_loss.loss(self.model, moved, moved)
        self.wait()
        self.plain_times.append(CLOCK() - start)


def machinery_interleaved(b, h, mode, engines, device, wait, batches, repeats, train_step=None):
    """``machinery_seconds`` for several engines at once, their repeats interleaved (each
    repeat times the training step, then every engine's sifted and plain epoch), so a
    change of the machine's speed moves all engines alike: {engine: result}."""
    arms = {e: _Arm(b, h, mode, e, device, wait, batches) for e in engines}
    step_times = []
    c0 = compiles()
    for _ in range(repeats):
        if train_step is not None:
            step_times.append(train_step.seconds(5))
        for arm in arms.values():
            arm.repeat()
    new_compiles = compiles() - c0
    out = {}
    for e, arm in arms.items():
        # Paired: each repeat's sifted epoch against the plain epoch right after it, so a
        # drift of the machine's speed cancels; the median over repeats is reported.
        diffs = [(s_ - p_) / batches for s_, p_ in zip(arm.sift_times, arm.plain_times, strict=True)]
        wall = statistics.median(diffs)
        step = statistics.median(step_times) if step_times else None
        share = statistics.median(d / t for d, t in zip(diffs, step_times, strict=True)) if step_times else None
        out[e] = (max(wall, 0.0), arm.host / (repeats * batches), new_compiles, step, share, (min(diffs), max(diffs)))
    return out


def machinery_seconds(b, h, mode, engine, device, wait, batches, repeats, train_step=None):
    """Per source batch: (wall-clock machinery, host-phase machinery, compiles in timed epochs,
    training step seconds or None, machinery / step or None, (min, max) wall-clock machinery),
    medians over ``repeats`` interleaved repeats."""
    return machinery_interleaved(b, h, mode, [engine], device, wait, batches, repeats, train_step)[engine]


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
    global CLOCK
    CLOCK = CLOCKS[args.clock]
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
            train_step = TrainStep(b, device, wait)
            for h in args.histories:
                row = {"backend": backend, "batch_size": b, "history": h}
                steps = []
                if args.interleave:
                    results = machinery_interleaved(
                        b, h, args.mode, engines, device, wait, args.batches, args.repeats, train_step
                    )
                for engine in engines:
                    if args.interleave:
                        wall, host, new_compiles, step, share, spread = results[engine]
                    else:
                        wall, host, new_compiles, step, share, spread = machinery_seconds(
                            b, h, args.mode, engine, device, wait, args.batches, args.repeats, train_step
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
    print(format_table(rows, args.engines, args.markdown))
    print(f"\nrecords: {json_path}")
    return 0


def format_table(rows, engines, markdown=False):
    """Per engine: machinery ms per source batch and % of the training step (timed beside it)."""
    head = ["backend", "B", "H", "train step ms"]
    for k in engines:
        head += [f"{k} ms", f"{k} % of step"]
    lines = []
    for r in rows:
        cells = [r["backend"], str(r["batch_size"]), str(r["history"]), f"{r['step_ms']:.2f}"]
        for k in engines:
            if f"{k}_ms" in r:
                cells += [f"{r[f'{k}_ms']:.3f}", f"{100 * r[f'{k}_share']:.1f}"]
            else:
                cells += ["-", "-"]
        lines.append(cells)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in lines]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
