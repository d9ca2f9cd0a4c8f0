#!/usr/bin/env python
"""How does an epoch's planning grow with the dataset? Time, peak memory and collective bytes
per epoch against N, for the replicated score table and for the sharded one.

Two paths, each measured in a fresh process per (path, N, ranks) so that its peak resident
memory is its own (simulated scores: lognormal float32, 1% unscored; percentile policy,
``--kept-share`` budget, epoch 1 of 10: a sifted epoch):

* ``exact``: the loader's default (``score_table="replicated"``), one ``EpochPlanner.plan``
  over all ``N`` scores, as every rank runs it. Under data parallelism each rank also holds
  the whole table and joins one all-reduce of a ``[4, N]`` float32 tensor per epoch
  (``epoch/shares.merge_over_ranks``): ``16 N`` bytes.
* ``sharded``: the loader's ``score_table="sharded"`` path for one rank of ``W``, run as
  ``W`` gloo processes under torchrun (one process for ``W = 1``): the ``ShardedPlanner``
  and the ``ScoreTables`` of its owned samples, built as the loader builds them, and the
  epoch opening's planning of them, ``planner.plan(1, tables.snapshot())`` then
  ``tables.set_weights``: the summary gather, the two small all-reduces, the water-filling
  and the systematic sample of its own share. The slowest rank's time is reported (the
  ranks meet at the next collective); its collectives are counted by ``RankGroup`` where
  they ran, and the rank error is the merged summary's own bound.

Reported per row: planning time (``--clock``: the process's CPU time by default, one
thread; median and range over ``--repeats`` processes), the peak resident memory planning
added over the tables it starts from, the bytes held per owned sample right after planning
(counted from the real objects: score table, the plan's order, weights and inclusion, the
tables' weights and the last epoch's if the tables still keep them for batches of it that
wait for their losses; an array two of them share counted once) and once the first batch
of the new epoch has recorded its losses (when no earlier batch can still come),
collective bytes per epoch, and planning as a share of an epoch's training time at
``--train-us`` microseconds of training per sample per rank (an assumption, stated in the
output). A log-log least-squares fit of time against N per (path, W) gives the growth rate
and a projection to N = 1e9.

    python benchmarks/scale.py                                  # N = 1e5, 1e6, 1e7
    python benchmarks/scale.py --n 1e8 --out rows.jsonl         # appends to rows.jsonl
    python benchmarks/scale.py --plot-only rows.jsonl           # fits and plots every N recorded there

Output: a table and one JSON line per measurement (``--out``, default
``benchmarks/results/scale.jsonl``, appended), and a log-log plot beside it (``--plot``).
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach
import numpy as np

from benchmarks.studies.scale_report import latest_rows, plot, report, show

ROOT = Path(__file__).resolve().parents[1]
BATCH = 128


def scores_of(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    s = rng.lognormal(size=n).astype(np.float32)
    s[rng.random(n) < 0.01] = np.nan
    return s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def one_exact(n: int, kept_share: float) -> dict[str, Any]:
    import torch

    from neuron_sift import EpochSiftConfig
    from neuron_sift.epoch.planning.plan import PlanSettings
    from neuron_sift.epoch.score_table import score_table
    from neuron_sift.epoch.scores.rank_shares import RankShares
    from neuron_sift.epoch.scores.tables import ScoreTables
    from neuron_sift.shared.ranks import RankGroup

    torch.set_num_threads(1)
    settings = PlanSettings(EpochSiftConfig(kept_share=kept_share), n, BATCH, False, seed=0, num_epochs=10)
    parts = score_table("replicated").build(settings, RankGroup(None, torch.device("cpu")))  # as the loader builds it
    planner, shares = parts.planner, parts.shares
    assert isinstance(shares, RankShares)
    tables = ScoreTables(n)
    tables.load_scores(torch.from_numpy(scores_of(n, 1)))
    base = rss_bytes()
    start, cpu = time.perf_counter(), time.process_time()
    plan = planner.plan(1, tables.snapshot())
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    tables.set_weights(plan.weights, 1)  # the loader's tables keep this epoch's weights and the last's
    # What the loader holds per sample between epochs: the tables and the plan in progress,
    # plus the ranks' marks of which samples each trained.
    marks = shares.mine.nbytes + shares.carried.nbytes
    held = held_bytes(tables, plan) + marks
    first = plan.order[:BATCH].numpy()
    tables.record(first, torch.ones(first.shape[0]), 1)  # lets the last epoch's weights go
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_added": peak_bytes() - base,
        "held": held,
        "held_steady": held_bytes(tables, plan) + marks,
        "owned": n,
        "kept": plan.kept,
    }


def one_sharded(n: int, world: int, kept_share: float, knots: int) -> dict[str, Any] | None:
    """One rank's epoch opening under ``score_table="sharded"``, built as the loader builds
    it; with ``world > 1`` this process is one of ``world`` gloo ranks under torchrun and the
    plan's collectives cross for real. Rank 0 returns the slowest rank's row (the ranks wait
    for each other at the next collective), the others None."""
    import torch
    import torch.distributed as dist

    from neuron_sift import EpochSiftConfig
    from neuron_sift.epoch.planning.plan import PlanSettings
    from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
    from neuron_sift.epoch.score_table import score_table
    from neuron_sift.epoch.scores.tables import ScoreTables
    from neuron_sift.shared.ranks import RankGroup

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo")
    ranks = RankGroup(None, torch.device("cpu"))
    config = EpochSiftConfig(kept_share=kept_share, score_table="sharded")
    settings = PlanSettings(config, n, BATCH, False, 0, 10, ranks.world_size, ranks.rank)
    planner = score_table("sharded").build(settings, ranks).planner  # as the loader builds it
    assert isinstance(planner, ShardedPlanner)
    planner.knots = knots  # the summary's size under study (the loader's default: KNOTS)
    tables = ScoreTables(planner.table_size)
    owned = planner.owner.owned
    tables.load_scores(torch.from_numpy(scores_of(owned, 10 + ranks.rank)))
    base = rss_bytes()
    start, cpu = time.perf_counter(), time.process_time()
    plan = planner.plan(1, tables.snapshot())
    tables.set_weights(plan.weights, 1)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    peak_added = peak_bytes() - base
    summary = planner.last_summary
    if summary is None:
        raise AssertionError("epoch 1 was not sifted: nothing to measure")
    held = held_bytes(tables, plan)
    # The first loss of the new epoch lets the last epoch's weights go (tables.record).
    first = plan.order[:BATCH].numpy()
    tables.record(planner.slots(first), torch.ones(first.shape[0]), 1)
    row = {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_added": peak_added,
        "held": held,
        "held_steady": held_bytes(tables, plan),
        "owned": owned,
        "kept": plan.kept,
        "rank_error": summary.rank_error,
        "collective": ranks.received_bytes,
    }
    if not ranks.active:
        return row
    rows: list[Any] = [None] * world
    dist.all_gather_object(rows, row)
    dist.destroy_process_group()
    if ranks.rank != 0:
        return None
    slowest = max(rows, key=lambda r: r["cpu_seconds"])
    return {**slowest, "peak_added": max(r["peak_added"] for r in rows)}


def held_bytes(tables: Any, plan: Any) -> int:
    """What a rank's tables and plan in progress hold (either path), counted from the objects
    themselves: the tables keep the plan's weight array, and memory two of them share is
    counted once."""
    arrays = [tables._scores, plan.order.numpy(), plan.weights.numpy()]
    if not np.shares_memory(tables._weights, arrays[2]):
        arrays.append(tables._weights)
    if tables._previous is not None:
        arrays.append(tables._previous[1])
    if plan.inclusion is not None:
        arrays.append(plan.inclusion.numpy())
    return sum(int(a.nbytes) for a in arrays)


def run_child(args: argparse.Namespace) -> int:
    row: dict[str, Any] | None
    if args.path == "exact":
        row = one_exact(args.child_n, args.kept_share)
    else:
        row = one_sharded(args.child_n, args.child_world, args.kept_share, args.knots)
    if row is not None:
        print(json.dumps(row))
    return 0


def measure(path: str, n: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for _ in range(args.repeats):
        cmd = [sys.executable, __file__]
        if path == "sharded" and world > 1:  # real gloo ranks
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--nnodes=1"]
            cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__]
        cmd += ["--child", path, "--child-n", str(n), "--child-world", str(world)]
        cmd += ["--kept-share", str(args.kept_share), "--knots", str(args.knots)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    seconds = [r["cpu_seconds" if args.clock == "cpu" else "seconds"] for r in runs]
    owned = runs[0]["owned"]  # the slowest rank's share on the sharded path
    # The exact path's merge is one all-reduce of a [4, N] float32 tensor (under data
    # parallelism); the sharded path's collectives are counted where they ran.
    collective = 16 * n if (path == "exact" and world > 1) else runs[0].get("collective", 0)
    median = statistics.median(seconds)
    return {
        "path": path,
        "n": n,
        "ranks": world,
        "owned": owned,
        "clock": args.clock,
        "seconds_median": median,
        "seconds_range": [min(seconds), max(seconds)],
        "peak_added_bytes": statistics.median(r["peak_added"] for r in runs),
        "held_bytes_per_owned": runs[0]["held"] / owned,
        "held_steady_bytes_per_owned": runs[0]["held_steady"] / owned,
        "collective_bytes": collective,
        # Each rank trains its N / W samples of the epoch whatever the path.
        "plan_share_of_epoch": median / ((n // world) * args.train_us * 1e-6),
        "train_us_per_sample": args.train_us,
        "kept": runs[0]["kept"],
        "rank_error": runs[0].get("rank_error", 0.0),
        "repeats": args.repeats,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=float, default=[1e5, 1e6, 1e7], help="dataset sizes")
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4], help="ranks for the sharded path")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per measurement")
    p.add_argument("--kept-share", type=float, default=0.5)
    p.add_argument("--knots", type=int, default=4096, help="points per rank's score summary")
    p.add_argument("--train-us", type=float, default=100.0, help="assumed training time per sample per rank (us)")
    p.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="the process's CPU time (default: one thread, so it is what the wall-clock of an idle machine "
        "would be; a shared machine stretches only the wall-clock) or the wall-clock",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.jsonl"))
    p.add_argument("--plot", default=None, help="PNG path (default: beside --out, or beside --plot-only's file)")
    p.add_argument(
        "--plot-only",
        default=None,
        metavar="FILE",
        help="measure nothing: fit and plot the latest row of each (path, N, ranks) recorded in FILE",
    )
    p.add_argument("--child", choices=["exact", "sharded"], help=argparse.SUPPRESS)
    p.add_argument("--child-n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-world", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.path = args.child
        return run_child(args)
    if args.plot_only:
        recorded = Path(args.plot_only)
        rows = latest_rows(recorded)
        for r in sorted(rows, key=lambda r: (r["n"], r["path"], r["ranks"])):
            show(r)
        groups = report(rows, rows[0]["train_us_per_sample"])
        plot_path = Path(args.plot) if args.plot else recorded.with_suffix(".png")
        plot(groups, plot_path)
        print(f"plot: {plot_path}")
        return 0
    rows = []
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for n in [int(n) for n in args.n]:
        rows.append(measure("exact", n, 1, args))
        show(rows[-1])
        for w in args.ranks:
            rows.append(measure("sharded", n, w, args))
            show(rows[-1])
    groups = report(rows, args.train_us)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for r in rows:
            f.write(json.dumps({**r, "stamp": stamp}) + "\n")
    plot_path = Path(args.plot) if args.plot else out.with_suffix(".png")
    plot(groups, plot_path)
    print(f"records: {out}\nplot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
