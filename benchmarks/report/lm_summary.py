"""The single-pass language-model task's arithmetic and tables: held-out loss (lower is
better) against compute, and each arm's cost accounting.

Per seed (``annotate_lm_seed``), every arm is paired with that seed's ``lm-full``:

* target: ``lm-full``'s final held-out bits per byte plus the task's tolerance;
* time (and steps) to target: the first evaluation from which every later one stays at or
  below the target (``time_to_target_low``);
* ``speedup_vs_full``: ``lm-full``'s time to target / the arm's; ``speedup_vs_frontier``:
  the shortest of any frontier run's (``lm-full``, ``lm-full@X``) / the arm's;
* ``predicted_speedup``: the same ratio with the arm's time to target predicted by the cost
  model: its steps to target times a step's predicted cost, which is ``lm-full``'s measured
  training-step time per trained sample times the samples the arm trains per step, plus
  ``lm-full``'s scoring-forward cost per sample (the task's measured scoring share of a
  step, applied to that training time) times the samples it scores per step, plus
  ``lm-full``'s data path per step (an arm scoring with another model, or a reference
  table, has its scoring part as measured: the model predicts the rest). Where measured and predicted differ, ``excess_ms``
  says which part of the arm's step cost more than predicted (per step, milliseconds):
  ``train_step``, ``scoring``, ``machinery`` (predicted 0: the cost model has no selection
  cost) and ``data_path`` (reading the stream, batching; the rest of the run's time).
"""

from collections.abc import Sequence

from benchmarks.report.summary import EPS, _ratio, fmt, grouped, stat, text_table, time_key

EXCESS_PARTS = ("train_step", "scoring", "machinery", "data_path")
NOT_APPLICABLE = (
    "epoch-level arms (epoch, dynamic-random, seta, infobatch) do not apply to a single pass: they select from "
    "the whole dataset epoch by epoch, and a single pass never returns to a sample."
)


def is_lm_frontier(arm: str) -> bool:
    return arm == "lm-full" or arm.startswith("lm-full@")


def time_to_target_low(curve: Sequence[dict], target: float, key: str) -> float | None:
    """``key`` of the first evaluation from which every later one stays <= ``target``."""
    t = None
    for point in curve:
        if point["heldout_bpb"] <= target + EPS:
            if t is None:
                t = point[key]
        else:
            t = None
    return t


def _prediction(arm: dict, full: dict, clock: str, probe: dict) -> dict:
    parts_full, parts = full["parts_s"][clock], arm["parts_s"][clock]
    steps = max(arm["steps"], 1)
    per_sample = parts_full["train_step"] / max(full["backward_samples"], 1)
    predicted = {
        "train_step": per_sample * arm["backward_samples"] / steps,
        "scoring": probe["scoring_share_of_step"] * per_sample * arm["scoring_forward_samples"] / steps,
        "machinery": 0.0,
        "data_path": parts_full["data_path"] / max(full["steps"], 1),
    }
    if arm.get("scorer", "model") != "model":  # a scorer other than the learner: its cost as measured
        predicted["scoring"] = parts["scoring"] / steps
    excess = {k: round(1000.0 * (parts[k] / steps - predicted[k]), 3) for k in EXCESS_PARTS}
    to_target = arm.get("steps_to_target")
    time_pred = None if to_target is None else to_target * sum(predicted.values())
    return {
        "predicted_step_s": round(sum(predicted.values()), 6),
        "measured_step_s": round(sum(parts.values()) / steps, 6),
        "predicted_time_to_target_s": time_pred,
        "predicted_speedup": _ratio(full["time_to_target_s"], time_pred),
        "excess_ms": excess,
        "largest_excess": max(excess, key=lambda k: abs(excess[k])),
    }


def annotate_lm_seed(results: dict[str, dict], tolerance: float, clock: str, probe: dict) -> None:
    """Adds the target, times and steps to target, speedups and the cost prediction to every
    arm's results of one seed (``results``: arm -> result dict with its curve)."""
    key = time_key(clock)
    full = results["lm-full"]
    target = full["final_bpb"] + tolerance
    for r in results.values():
        r["clock"] = clock
        r["target_bpb"] = round(target, 5)
        r["time_to_target_s"] = time_to_target_low(r["curve"], target, key)
        r["steps_to_target"] = time_to_target_low(r["curve"], target, "steps")
    frontier = [r["time_to_target_s"] for a, r in results.items() if is_lm_frontier(a)]
    best = min((t for t in frontier if t is not None), default=None)
    for r in results.values():
        r["paired"] = {
            "speedup_vs_full": _ratio(full["time_to_target_s"], r["time_to_target_s"]),
            "speedup_vs_frontier": _ratio(best, r["time_to_target_s"]),
            "speedup_steps_vs_full": _ratio(full["steps_to_target"], r["steps_to_target"]),
            "bpb_vs_full": r["final_bpb"] - full["final_bpb"],
            **_prediction(r, full, clock, probe),
        }


def _median(values: Sequence[float | None], digits: int) -> tuple:
    return tuple(None if v is None else round(v, digits) for v in stat(values))


def summarize_lm(records: list[dict]) -> list[dict]:
    """One row per (backend, device, corpus, arm), in the order of the records (records
    before ``--corpus`` existed are the clean corpus's)."""
    rows = []
    keyed = [{**r, "corpus_option": r["config"].get("corpus_option", "clean")} for r in records]
    for (backend, device, corpus, arm), mine in grouped(keyed, ("backend", "device", "corpus_option", "arm")).items():
        res = [r["results"] for r in mine]
        probes = [r["config"]["cost_probe"] for r in mine]
        clock = res[0]["clock"]
        p = [x["paired"] for x in res]
        row: dict = {"task": "lm", "backend": backend, "device": device, "corpus": corpus, "arm": arm}
        row.update(clock=clock, seeds=len(res))
        row["reached"] = sum(x["time_to_target_s"] is not None for x in res)
        row["per_seed_speedup"] = [None if q["speedup_vs_full"] is None else round(q["speedup_vs_full"], 3) for q in p]
        metrics = {
            "speedup_vs_full": ([q["speedup_vs_full"] for q in p], 3),
            "predicted_speedup": ([q["predicted_speedup"] for q in p], 3),
            "speedup_vs_frontier": ([q["speedup_vs_frontier"] for q in p], 3),
            "speedup_steps_vs_full": ([q["speedup_steps_vs_full"] for q in p], 3),
            "final_bpb": ([x["final_bpb"] for x in res], 4),
            "bpb_vs_full": ([q["bpb_vs_full"] for q in p], 4),
            "target_bpb": ([x["target_bpb"] for x in res], 4),
            "total_s": ([x[time_key(clock)] for x in res], 2),
            "source_read": ([x["source_samples_read"] for x in res], 0),
            "fwd_samples": ([x["forward_samples"] for x in res], 0),
            "bwd_samples": ([x["backward_samples"] for x in res], 0),
            "kept_share": ([x["kept_share"] for x in res], 4),
            "backward_to_forward": ([q["backward_to_forward"] for q in probes], 3),
            "scoring_share_of_step": ([q["scoring_share_of_step"] for q in probes], 3),
            "probe_step_ms": ([1000.0 * q["train_step_s"] for q in probes], 2),
        }
        metrics.update({f"{k}_s": ([x["parts_s"][clock][k] for x in res], 3) for k in (*EXCESS_PARTS,)})
        metrics.update({f"excess_{k}_ms": ([q["excess_ms"][k] for q in p], 2) for k in EXCESS_PARTS})
        for k, (values, digits) in metrics.items():
            row[k], row[k + "_min"], row[k + "_max"] = _median(values, digits)
        largest = [q["largest_excess"] for q in p]
        row["largest_excess"] = max(set(largest), key=largest.count)
        rows.append(row)
    return rows


HEADLINE = [
    ("speedup_vs_full", "speedup vs full", ".2f"),
    ("speedup_vs_frontier", "vs frontier", ".2f"),
    ("speedup_steps_vs_full", "in steps vs full", ".2f"),
    ("final_bpb", "held-out bpb", ".4f"),
    ("bpb_vs_full", "bpb vs full", "+.4f"),
    ("total_s", "total s", "s"),
    ("source_read", "source read", ".0f"),
    ("kept_share", "kept share", ".3f"),
]
COSTS = [
    ("fwd_samples", "fwd samples", ".0f"),
    ("bwd_samples", "bwd samples", ".0f"),
    ("train_step_s", "train-step s", "s"),
    ("scoring_s", "scoring s", "s"),
    ("machinery_s", "machinery s", "s"),
    ("data_path_s", "data path s", "s"),
    ("speedup_vs_full", "measured speedup", ".2f"),
    ("predicted_speedup", "predicted speedup", ".2f"),
    ("excess_train_step_ms", "excess ms/step: train", "+.2f"),
    ("excess_scoring_ms", "scoring", "+.2f"),
    ("excess_machinery_ms", "machinery", "+.2f"),
    ("excess_data_path_ms", "data path", "+.2f"),
]


def _table(rows: list[dict], columns: list[tuple], extra: dict[str, list[str]]) -> list[str]:
    heads = ["arm", "reached"] + [h for _, h, _ in columns] + list(extra)
    cells = []
    for i, r in enumerate(rows):
        line = [r["arm"], f"{r['reached']}/{r['seeds']}"] + [fmt(r, k, s) for k, _, s in columns]
        cells.append(line + [v[i] for v in extra.values()])
    return text_table(heads, cells)


def format_lm_tables(rows: list[dict]) -> str:
    """The headline table (held-out loss against time, per-seed speedups), the measured step
    costs, and the cost table."""
    out = []
    for group in dict.fromkeys((r["backend"], r["device"], r.get("corpus", "clean")) for r in rows):
        rs = [r for r in rows if (r["backend"], r["device"], r.get("corpus", "clean")) == group]
        full = next((r for r in rs if r["arm"] == "lm-full"), rs[0])
        out.append(
            f"lm ({group[0]}, {group[1]}, {group[2]} corpus), {full['seeds']} seed(s), times on the {full['clock']} clock, "
            f"target = full's final held-out bpb + tolerance: {fmt(full, 'target_bpb', '.4f')}"
        )
        per_seed = [" ".join("-" if s is None else f"{s:.2f}" for s in r["per_seed_speedup"]) for r in rs]
        out += _table(rs, HEADLINE, {"speedup per seed": per_seed})
        out.append(NOT_APPLICABLE)
        out.append(
            f"step costs (cost_probe, one per task run): backward+optimizer / forward "
            f"{fmt(full, 'backward_to_forward', '.2f')}, scoring forward / training step "
            f"{fmt(full, 'scoring_share_of_step', '.2f')}, training step {fmt(full, 'probe_step_ms', '.1f')} ms"
        )
        out.append("")
        out.append("cost accounting (seconds on the table's clock; excess: measured minus predicted, per step)")
        out += _table(rs, COSTS, {"largest excess": [r["largest_excess"] for r in rs]})
        out.append("")
    return "\n".join(out)
