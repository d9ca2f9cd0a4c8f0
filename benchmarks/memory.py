"""Does sifting leak? Process and device memory over a long run of a tiny model.

Runs --batches source batches (default 100,000) through a SiftingDataloader with a tiny
model and a training step on every emitted batch, sampling the process's resident memory
(and the device's, where it can be read) every --every batches. Reports the growth after
warm-up (the first sample) as bytes per 10,000 source batches.

    python benchmarks/memory.py                       # eager CPU, both modes
    PJRT_DEVICE=CPU python benchmarks/memory.py --backend xla
"""

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader


def rss_bytes() -> int:
    """Current resident set size, from /proc (Linux); peak RSS elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_bytes(device: torch.device):
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    if device.type == "xla":
        try:
            import torch_xla.core.xla_model as xm

            # a plain mapping: the keys differ between torch-xla versions (bytes_used; kb_total, kb_free)
            info: dict[str, Any] = dict(xm.get_memory_info(device))
            return int(info.get("bytes_used", info.get("kb_total", 0) - info.get("kb_free", 0)))
        except Exception:  # the CPU PJRT client reports no memory info
            return None
    return None


class Repeat:
    """An iterable of ``n`` source batches built from a few fixed tensors (no data cost)."""

    def __init__(self, n: int, batch_size: int):
        g = torch.Generator().manual_seed(0)
        self.batches = [
            (torch.randn(batch_size, 8, generator=g), torch.randint(0, 2, (batch_size,), generator=g))
            for _ in range(16)
        ]
        self.n = n
        self.batch_size = batch_size

    def __iter__(self):
        for i in range(self.n):
            yield self.batches[i % len(self.batches)]


class CE:
    def loss(self, model, transformed_batch, original_batch=None):
        device = next(model.parameters()).device
        x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device), reduction="none")


def run(mode: str, backend: str, batches: int, every: int) -> dict:
    sync: Callable[[], object]
    if backend == "xla":
        import torch_xla

        device = torch_xla.device()
        sync = torch_xla.sync
    else:
        device = torch.device("cuda" if backend == "cuda" else "cpu")
        sync = lambda: None  # noqa: E731
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=512,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            selection_mode=mode,
            seed=0,
        ),
        orig_dataloader=Repeat(batches, 8),
        loss_impl=CE(),
        model=model,
    )
    samples = []
    start = time.perf_counter()
    last_seen = 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sync()
        seen = loader.counts.num_source_batches
        if seen // every > last_seen // every:
            samples.append({"source_batches": seen, "rss": rss_bytes(), "device": device_bytes(device)})
        last_seen = seen
    elapsed = time.perf_counter() - start
    warm = samples[0]
    growth = [s["rss"] - warm["rss"] for s in samples]
    span = (samples[-1]["source_batches"] - warm["source_batches"]) / 10_000 or 1
    dev_growth = None
    if warm["device"] is not None:
        dev_growth = samples[-1]["device"] - warm["device"]
    return {
        "mode": mode,
        "backend": backend,
        "source_batches": loader.counts.num_source_batches,
        "seconds": round(elapsed, 1),
        "rss_after_warmup_mb": round(warm["rss"] / 2**20, 1),
        "rss_final_mb": round(samples[-1]["rss"] / 2**20, 1),
        "rss_max_growth_mb": round(max(growth) / 2**20, 2),
        "rss_growth_per_10k_batches_kb": round((samples[-1]["rss"] - warm["rss"]) / 1024 / span, 1),
        "device_growth_bytes": dev_growth,
        "samples": samples,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=100_000, help="source batches per mode")
    p.add_argument("--every", type=int, default=10_000, help="sample memory every this many source batches")
    p.add_argument("--backend", choices=["eager", "cuda", "xla"], default="eager")
    p.add_argument("--modes", default="probabilistic,fixed")
    p.add_argument("--json", help="append one JSON line per mode to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"{'mode':<14}{'backend':<8}{'batches':>9}{'secs':>8}{'RSS warm MB':>13}{'RSS end MB':>12}"
        f"{'max growth MB':>15}{'KB/10k batches':>16}{'device growth B':>17}"
    )
    for mode in args.modes.split(","):
        r = run(mode, args.backend, args.batches, args.every)
        print(
            f"{r['mode']:<14}{r['backend']:<8}{r['source_batches']:>9}{r['seconds']:>8}{r['rss_after_warmup_mb']:>13}"
            f"{r['rss_final_mb']:>12}{r['rss_max_growth_mb']:>15}{r['rss_growth_per_10k_batches_kb']:>16}"
            f"{str(r['device_growth_bytes']):>17}",
            flush=True,
        )
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
