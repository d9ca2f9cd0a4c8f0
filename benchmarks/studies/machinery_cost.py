"""What ``benchmarks/machinery.py`` times and prints: the sifting machinery of each engine
over an epoch of source batches against the plain epoch, a training step beside it, and
the table (the method is in that script's docstring; this module holds the parts, the
script the command line).

The clock is a parameter (``--clock``'s choice), not a global the script sets: the tests
call the parts directly.
"""

import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import neuron_sift.engine.step as step_module
from benchmarks.tasks.mnist1d import CNN1D
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.engine.sifter import Sifter
from neuron_sift.kernels.percentile import percentile_rank, percentile_rank_auto
from neuron_sift.sift_config.sift_configs import RelativeProbabilisticSiftConfig


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
    """One training step (forward, backward, Adam) of the default model at batch size b,
    timed on ``clock``."""

    def __init__(self, b, device, wait, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
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
            start = self.clock()
            self.opt.zero_grad(set_to_none=True)
            F.cross_entropy(self.model(self.x), self.y).backward()
            self.opt.step()
            self.wait()
            times.append(self.clock() - start)
        return statistics.median(times)


class _Arm:
    """One engine's loader over the benchmark's data: a warm-up epoch, then timed repeats."""

    def __init__(self, b, h, mode, engine, device, wait, batches, clock: Callable[[], float]):
        host_step, self.kernel, trace_once = ENGINES[engine]
        self.clock = clock
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
        if not trace_once:  # the retrace engine: XLA only, whose backend has the switch
            self.loader.backend.trace_once = False  # type: ignore[attr-defined]
        self.sift_times: list[float] = []
        self.plain_times: list[float] = []
        self.host = 0.0
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
        start = self.clock()
        self._epoch()
        self.sift_times.append(self.clock() - start)
        self.host += self.loader.machinery_seconds - before
        start = self.clock()
        for batch in self.source():  # the same epoch without sifting: loading, the move to the device, the loss
            moved = [t.to(self.device) for t in batch]
            with torch.no_grad():
                self.user_loss.loss(self.model, moved, moved)
        self.wait()
        self.plain_times.append(self.clock() - start)


def machinery_interleaved(
    b, h, mode, engines, device, wait, batches, repeats, train_step=None, clock: Callable[[], float] = time.perf_counter
):
    """``machinery_seconds`` for several engines at once, their repeats interleaved (each
    repeat times the training step, then every engine's sifted and plain epoch), so a
    change of the machine's speed moves all engines alike: {engine: result}. The epochs are
    timed on ``clock`` (the training step on its own)."""
    arms = {e: _Arm(b, h, mode, e, device, wait, batches, clock) for e in engines}
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


def machinery_seconds(
    b, h, mode, engine, device, wait, batches, repeats, train_step=None, clock: Callable[[], float] = time.perf_counter
):
    """Per source batch: (wall-clock machinery, host-phase machinery, compiles in timed epochs,
    training step seconds or None, machinery / step or None, (min, max) wall-clock machinery),
    medians over ``repeats`` interleaved repeats."""
    return machinery_interleaved(b, h, mode, [engine], device, wait, batches, repeats, train_step, clock)[engine]


def machinery_table(rows, engines, markdown=False):
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
