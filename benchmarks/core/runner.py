"""Runs the arms fairly: seeds, initial weights, the arm's context, the clock, evaluation,
the results of a run and the lines of ``runs.jsonl``.

Fairness, per seed: the same initial weights (built once, copied into every arm), the same
data order (``fairness.EpochOrder``: one permutation per seed and epoch, the same for every
arm), the same optimizer, and a cosine learning-rate schedule that decays to 0 at the end
of the arm's *own* run (``fairness.CosineSchedule``: over its planned steps, or epoch by
epoch when each epoch's length is known only when it is planned), after a linear warm-up
over the task's ``warmup`` share of that same run (0 for most tasks). Wall-clock
(``clock.Clock``) covers everything the training loop waits for, scoring forwards and
selection included; the clock is paused while test accuracy is evaluated
(``evals_per_epoch`` times per epoch of source data). The arms of a seed run in a seeded
random order, so a drift in the machine's speed does not favour one arm systematically; an
untimed warm-up of a throwaway model pays the process's one-time costs before the first arm.

The runner is handed the arms (name -> the arm's function), it does not look them up: the
registry (``benchmarks/arms/``) sits above this package, its arms import the context and
the loops from here, and an import back up would make the two packages a circle.
"""

import copy
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.core.compiled import compile_model, count_compiles
from benchmarks.core.context import ArmContext, evaluate
from benchmarks.core.fairness import EpochOrder
from benchmarks.core.task_costs import describe_probe, task_cost_probe
from benchmarks.instruments.clock import Clock, XlaCounters
from benchmarks.instruments.records import append_record, run_record
from benchmarks.report.summary import annotate_seed
from benchmarks.tasks.registry import Data, TaskConfig, make_model


def arm_context(
    name: str, task: TaskConfig, data: Data, seed: int, init_state: dict, opts: Any, backend: dict[str, Any]
) -> ArmContext:
    """The seed's model (its initial weights), optimizer, data in the seed's order and a clock
    at 0, for arm ``name``."""
    device = backend["device"]
    torch.manual_seed(seed)
    model = make_model(task)
    model.load_state_dict(init_state)  # same initial weights in every arm
    model.to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=task.lr, weight_decay=task.weight_decay)
    trained_model = compile_model(model, backend, lambda m: warm_up_compiled(m, task, data, device))
    n = data.x_train.shape[0]
    dataset = TensorDataset(data.x_train, data.y_train, torch.arange(n))
    order = EpochOrder(n, seed)
    source = DataLoader(dataset, batch_size=task.batch_size, sampler=order)
    progress = None
    if opts.progress:
        from tqdm import tqdm

        progress = tqdm(total=None, desc=f"{task.name} seed {seed} {name}", leave=False, dynamic_ncols=True)
    ctx = ArmContext(
        task=task,
        data=data,
        seed=seed,
        device=device,
        epochs=task.epochs,
        beta=opts.beta,
        model=trained_model,
        optimizer=optimizer,
        dataset=dataset,
        source=source,
        order=order.order,
        clock=Clock(backend.get("wait")),
        evals_per_epoch=opts.evals_per_epoch,
        sync=backend.get("sync"),
        counters=XlaCounters() if backend["name"] == "xla" else None,
        progress=progress,
    )
    ctx._next_eval = n / opts.evals_per_epoch
    return ctx


def warm_up_compiled(model: torch.nn.Module, task: TaskConfig, data: Data, device: torch.device) -> None:
    """Compiles, before the clock starts, every graph an arm calls: the training forward and
    backward, the scoring forward without gradients in train mode (the peers' loops) and in
    eval mode (the sifting loader's), each at the batch size and at a smaller one marked
    dynamic (Dynamo then compiles the batch-size-generic graph every short last batch and
    the evaluation's chunks use; without the mark it compiles that size alone, and each
    short batch later recompiles while the clock runs). No optimizer steps: the weights stay
    the seed's initial ones."""
    for rows in dict.fromkeys((task.batch_size, task.batch_size // 2 + 1)):
        x, y = data.x_train[:rows].to(device), data.y_train[:rows].to(device)
        if rows != task.batch_size:
            torch._dynamo.mark_dynamic(x, 0)
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            model(x)
            model.eval()
            model(x)
            model.train()
    evaluate(model, data.x_test, data.y_test, device)


def arm_results(ctx: ArmContext, extra: dict) -> dict:
    """A finished run's results: accuracy, times, steps, sample counts, its curve, the arm's
    own keys (``extra``), and the mislabeled shares and XLA counters where they apply."""
    task, n = ctx.task, len(ctx.dataset)
    seen = ctx.epochs_run * n
    kept = extra.pop("samples_kept", ctx.trained_samples)
    scoring = extra.pop("scoring_forward_samples", 0)
    planned = extra.pop("planned_steps", ctx.schedule.planned if ctx.schedule else ctx.steps)
    result = {
        "final_test_acc": ctx.curve[-1]["test_acc"],
        "wall_s": round(ctx.clock.total, 4),
        "cpu_s": round(ctx.clock.cpu_total, 4),
        "epochs": ctx.epochs_run,
        "steps": ctx.steps,
        "planned_steps": planned,
        "lr_at_end": ctx.optimizer.param_groups[0]["lr"],
        "source_samples_seen": seen,
        "samples_kept": kept,
        "kept_share": round(kept / max(task.epochs * n, 1), 4),
        "scoring_forward_samples": scoring,
        "training_forward_samples": ctx.trained_samples,
        "forward_samples": scoring + ctx.trained_samples,
        "backward_samples": ctx.trained_samples,
        "curve": ctx.curve,
        **extra,
    }
    if task.label_noise:
        result["mislabeled_share_trained"] = round(ctx.mislabeled / max(ctx.trained_samples, 1), 4)
        result["mislabeled_share_trained_per_epoch"] = ctx.mislabeled_per_epoch
        result["mislabeled_share_data"] = round(float(ctx.data.mislabeled.float().mean()), 4)
    if ctx.counters:
        result["xla_compiles"] = ctx.counters.compiles
        result["xla_host_reads"] = ctx.counters.reads
        result["xla_host_reads_per_step"] = round(ctx.counters.reads / max(ctx.steps, 1), 3)
    return result


# An arm: trains on the context it is handed, returns its own result keys (or None).
Arm = Callable[[ArmContext], dict | None]


def run_arm(
    name: str,
    arm: Arm,
    task: TaskConfig,
    data: Data,
    seed: int,
    init_state: dict,
    opts: Any,
    backend: dict[str, Any],
) -> dict:
    """One arm, one seed: the arm's training, timed, and its results (without the pairing)."""
    ctx = arm_context(name, task, data, seed, init_state, opts, backend)
    ctx.evaluate()  # the starting point, at 0 s
    ctx.clock.resume()
    extra = count_compiles(
        backend, lambda: arm(ctx)
    )  # a graph compiled while the clock ran: a shape the warm-up missed
    if len(ctx.curve) > 1 and ctx.curve[-1]["steps"] == ctx.steps:
        ctx.curve.pop()  # evaluated at the last step already: evaluated again below, at the final clock
    ctx.evaluate(resume=False)  # final: the clock stays stopped
    if ctx.progress is not None:  # (a bar without a total has no truth value)
        ctx.progress.close()
    return arm_results(ctx, extra)


def warm_up(task: TaskConfig, data: Data, device: torch.device, steps: int = 20) -> None:
    """Untimed: a throwaway model trains a few steps (allocator, kernels, lazy imports)."""
    model = make_model(task).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=task.lr)
    for i in range(steps):
        j = (i * task.batch_size) % max(data.x_train.shape[0] - task.batch_size, 1)
        x = data.x_train[j : j + task.batch_size].to(device)
        y = data.y_train[j : j + task.batch_size].to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    evaluate(model, data.x_test, data.y_test, device)


def run_task(
    task: TaskConfig,
    data: Data,
    arms: dict[str, Arm],
    opts: Any,
    backend: dict[str, Any],
    vers: dict,
    config: dict,
    json_path: Path,
) -> list[dict]:
    """Every seed, every arm (``arms``: name -> arm, in the order of the records; they run in
    a seeded random order), paired by seed, the times on ``opts.clock``; appends runs.jsonl."""
    records = []
    warm_up(task, data, backend["device"])
    probe = task_cost_probe(task, data, backend, opts.clock)
    print(describe_probe(probe, backend["device_desc"]), flush=True)
    config = {**config, "cost_probe": probe}
    for seed in opts.seeds:
        torch.manual_seed(seed)
        init_state = copy.deepcopy(make_model(task).state_dict())
        run_order = list(arms)
        random.Random(seed).shuffle(run_order)
        results = {}
        for arm in run_order:
            r = run_arm(arm, arms[arm], task, data, seed, init_state, opts, backend)
            results[arm] = r
            print(
                f"  seed {seed} {arm:<18} acc {r['final_test_acc']:.2%}  wall {r['wall_s']:.1f} s  "
                f"cpu {r['cpu_s']:.1f} s  steps {r['steps']}/{r['planned_steps']}  kept {r['kept_share']:.3f}",
                flush=True,
            )
        annotate_seed(results, opts.target_drop, opts.clock, probe)  # target, time to target, the paired numbers
        for arm in arms:
            line = run_record(task.name, arm, seed, backend, vers, config, results[arm])
            records.append(line)
            append_record(json_path, line)
    return records
