"""Runs the single-pass language-model task's arms fairly and writes their records.

Fairness, per seed, as in ``runner.py``: the same initial weights, the same stream of
windows, the same optimizer (Adam), a cosine schedule decayed to the end of the arm's own
step budget after the same warm-up share, the clock paused while held-out loss is
evaluated, the arms in a seeded random order. The cost of a step (``lm_model.cost_probe``)
is measured once per task run on a throwaway model, before the first arm, and goes into
every record with the corpus's size and checksum and the device.
"""

import copy
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.core.compiled import compile_model, count_compiles
from benchmarks.core.lm_context import PARTS, LMConfig, LMContext, PartTimes, keep_count, stream_loader
from benchmarks.core.task_costs import describe_probe, probe_on_backend
from benchmarks.instruments.clock import Clock
from benchmarks.instruments.records import append_record, run_record
from benchmarks.report.lm_summary import annotate_lm_seed
from benchmarks.tasks.lm_corpus import Corpus, stream_order
from benchmarks.tasks.lm_model import ByteTransformer, sequence_losses

LMArm = Callable[[LMContext], dict | None]


def make_lm_context(
    config: LMConfig, corpus: Corpus, seed: int, init_state: dict, backend: dict[str, Any], progress: bool
) -> LMContext:
    device = backend["device"]
    model = ByteTransformer(config.shape)
    model.load_state_dict(init_state)
    model.to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    trained_model = compile_model(model, backend, lambda m: warm_up_compiled(m, config, corpus, device))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=None, desc=f"lm seed {seed}", leave=False, dynamic_ncols=True)
    return LMContext(
        config=config,
        corpus=corpus,
        seed=seed,
        device=device,
        model=trained_model,
        optimizer=optimizer,
        source=stream_loader(corpus, stream_order(corpus.train.shape[0], seed), config.batch_size),
        clock=Clock(backend.get("wait")),
        parts=PartTimes(backend.get("wait")),
        sync=backend.get("sync"),
        progress=bar,
    )


def warm_up_compiled(model: torch.nn.Module, config: LMConfig, corpus: Corpus, device: torch.device) -> None:
    """Compiles, before the clock starts, every graph a run calls: the training forward and
    backward at the full batch and at SelectiveBackprop's smaller one, and the scoring
    forward (eval mode, no grad). The gradients are dropped and no optimizer steps, so the
    weights stay the seed's initial ones; compilation is no arm's training time."""
    for rows in dict.fromkeys((config.batch_size, keep_count(config.sb_keep, config.batch_size))):
        seq = corpus.heldout[:rows].to(device) if corpus.heldout.shape[0] >= rows else corpus.train[:rows].to(device)
        sequence_losses(model, seq).mean().backward()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            model.eval()
            sequence_losses(model, seq)
            model.train()


def lm_results(ctx: LMContext, extra: dict) -> dict:
    """A finished run's results: held-out loss, times, steps, sample counts, the time per
    part on both clocks (``data_path``: the rest of the run's time), its curve, the arm's keys."""
    scoring = int(extra.pop("scoring_forward_samples", ctx.scoring_samples))
    parts = {}
    for clock, total, measured in (
        ("wall", ctx.clock.total, ctx.parts.wall),
        ("cpu", ctx.clock.cpu_total, ctx.parts.cpu),
    ):
        p = {k: round(measured[k], 4) for k in PARTS}
        p["data_path"] = round(max(total - sum(measured.values()), 0.0), 4)
        parts[clock] = p
    return {
        "final_bpb": ctx.curve[-1]["heldout_bpb"],
        "wall_s": round(ctx.clock.total, 4),
        "cpu_s": round(ctx.clock.cpu_total, 4),
        "steps": ctx.steps,
        "planned_steps": ctx.planned,
        "lr_at_end": ctx.optimizer.param_groups[0]["lr"],
        "source_samples_read": ctx.seen,
        "samples_kept": ctx.trained_samples,
        "kept_share": round(ctx.trained_samples / max(ctx.seen, 1), 4),
        "training_forward_samples": ctx.trained_samples,
        "scoring_forward_samples": scoring,
        "forward_samples": ctx.trained_samples + scoring,
        "backward_samples": ctx.trained_samples,
        "parts_s": parts,
        "curve": ctx.curve,
        **extra,
    }


def run_lm_arm(
    arm: LMArm,
    config: LMConfig,
    corpus: Corpus,
    seed: int,
    init_state: dict,
    backend: dict[str, Any],
    progress: bool = False,
) -> dict:
    """One arm, one seed: its training, timed, and its results (without the pairing)."""
    ctx = make_lm_context(config, corpus, seed, init_state, backend, progress)
    ctx.evaluate()  # the starting point, at 0 s
    ctx.clock.resume()
    extra = count_compiles(
        backend, lambda: arm(ctx)
    )  # a graph compiled while the clock ran: a shape the warm-up missed
    if ctx.steps != ctx.planned:
        raise RuntimeError(f"the arm took {ctx.steps} steps of its budget of {ctx.planned}")
    ctx.evaluate(resume=False)  # final: the clock stays stopped
    if ctx.progress is not None:
        ctx.progress.close()
    return lm_results(ctx, extra)


def probe_costs(config: LMConfig, corpus: Corpus, backend: dict[str, Any], clock: str, batches: int = 4) -> dict:
    """The task's step costs on this device (``cost_probe``) on the corpus's first batches, on
    the run's ``clock``."""
    b = config.batch_size
    sample = [corpus.train[i * b : (i + 1) * b] for i in range(batches)]
    return probe_on_backend(lambda: ByteTransformer(config.shape), sample, config.lr, backend, clock)


def run_lm_task(
    config: LMConfig,
    corpus: Corpus,
    arms: dict[str, LMArm],
    seeds: list[int],
    backend: dict[str, Any],
    vers: dict,
    run_config: dict,
    json_path: Path,
    clock: str,
    progress: bool = False,
) -> list[dict]:
    """Every seed, every arm (in a seeded random order), paired by seed on ``clock``;
    appends one record per run to ``json_path``."""
    probe = {**probe_costs(config, corpus, backend, clock), "clock": clock}
    print(describe_probe(probe, backend["device_desc"]), flush=True)
    run_config = {**run_config, "cost_probe": probe}
    records = []
    for seed in seeds:
        torch.manual_seed(seed)
        init_state = copy.deepcopy(ByteTransformer(config.shape).state_dict())
        order = list(arms)
        random.Random(seed).shuffle(order)
        results = {}
        for name in order:
            r = run_lm_arm(arms[name], config, corpus, seed, init_state, backend, progress)
            results[name] = r
            print(
                f"  seed {seed} {name:<24} bpb {r['final_bpb']:.4f}  wall {r['wall_s']:.1f} s  cpu {r['cpu_s']:.1f} s  "
                f"steps {r['steps']}  read {r['source_samples_read']}  trained {r['samples_kept']}",
                flush=True,
            )
        annotate_lm_seed(results, config.tolerance, clock, probe)
        for name in arms:
            line = run_record("lm", name, seed, backend, vers, run_config, results[name])
            records.append(line)
            append_record(json_path, line)
    return records
