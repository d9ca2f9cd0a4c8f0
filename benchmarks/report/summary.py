"""The suite's arithmetic: time to target, the full-data frontier, the paired headline
numbers, the summary rows (the schema of ``summary.jsonl``, which ``instruments/records.py``
writes) and the tables. Functions of the records only: no clock, no files (the plot is
``plot.py``).

Times are wall-clock (``clock="wall"``) or the process's CPU time over the same intervals
(``clock="cpu"``; see ``instruments/clock.py``); both are recorded in every run, the suite
picks the clock (``--clock``, by default the CPU clock for runs on the host's CPU).

Per seed (``annotate_seed``), every arm is paired with the ``full`` run and the frontier
runs (``full`` and every ``full@X``) of the same seed:

* target: ``full``'s final test accuracy minus ``target_drop`` points;
* time to target (``time_to_target``): the time of the first evaluation from which
  every later evaluation of the run stays at or above the target (not the first
  crossing, which rewards a lucky evaluation); ``None`` when the final one is below it;
* ``speedup_vs_full``: ``full``'s time to target / the arm's;
* ``speedup_vs_frontier``: the shortest time to target of any frontier run / the arm's;
* ``iso_time_gain``: the arm's final accuracy minus the frontier's accuracy at the arm's
  total wall-clock, in points; the frontier is piecewise linear through the (total wall,
  final accuracy) points of the seed's frontier runs, sorted by wall-clock
  (``frontier_at``); outside their range it is clamped to the nearest end point and the
  run says so (``iso_time_clamped``: ``"below"`` / ``"above"``);
* ``final_acc_delta``: the arm's final accuracy minus ``full``'s, in points;
* ``speedup_steps_vs_full``: ``full``'s training steps to the target / the arm's (the same
  rule on the curve's step counts). Why beside the time: a step trains one batch, so for
  the arms that skip samples without a scoring forward it counts their compute without
  the clock's noise (on a shared machine the same run's time to target varies more than
  its steps); it ignores the per-batch modes' scoring forwards, so for those arms the
  time is the measure.

* ``predicted_speedup``: the speedup over ``full`` that the per-batch cost model predicts
  from the run's sample counts and the task's measured step costs (``predicted_speedup``;
  the probe in every record's ``config["cost_probe"]``): a trained sample costs one, a
  scored one the scoring forward's share of a step, and each run spends a share of its
  samples up to the target proportional to its steps there. Where it exceeds the measured
  speedup, the arm's time went to what the model leaves out: its selection, planning and
  data path (for the epoch-level arms, which score nothing, it equals the speedup in steps).

An arm that never reaches the target has no speedup for that seed (``None``); the summary
counts the seeds that reached it and takes medians over those only.

``summary.jsonl``: one object per task, backend and arm: ``task``, ``arm``, ``backend``,
``clock`` (``wall`` or ``cpu``: the times of the speedups, the
iso-time gain and ``time_to_target_s``), ``seeds``, ``reached`` (seeds that reached the
target), ``commit``, and for each metric
``M`` of ``speedup_vs_full``, ``speedup_vs_frontier`` (over the seeds that reached the
target), ``iso_time_gain``, ``final_acc_delta`` (points), ``final_acc`` (%),
``speedup_steps_vs_full``, ``predicted_speedup``, ``time_to_target_s``, ``total_wall_s``, ``total_cpu_s``, ``bwd_samples``, ``fwd_samples``, ``kept_share``,
``target_acc`` (%): ``M`` the median over seeds, ``M_min`` and ``M_max``; ``null`` where
undefined (no seed reached the target). ``iso_time_clamped``: seeds whose iso-time value
was clamped. ``mislabeled_share`` (and its range) on ``mnist1d-noisy``.
``final_acc_delta_mean`` and ``final_acc_delta_ci95`` (``[low, high]``, points): the mean
of the per-seed paired differences ``final_acc_delta`` and its 95% Student t interval
over seeds (``confidence.mean_ci95``); the interval is ``null`` with one seed. An interval
wholly below 0 says the arm ends below ``full`` beyond the seeds' noise; one that holds 0
says the seeds cannot tell them apart (not that they are equal).
"""

import statistics
from collections.abc import Sequence

from benchmarks.report.confidence import mean_ci95

EPS = 1e-12


def is_frontier(arm: str) -> bool:
    return arm == "full" or arm.startswith("full@")


def time_key(clock: str) -> str:
    """The key of a curve point's (or a result's) time: "wall" -> wall_s, "cpu" -> cpu_s."""
    return {"wall": "wall_s", "cpu": "cpu_s"}[clock]


def time_to_target(curve: Sequence[dict], target: float, key: str = "wall_s") -> float | None:
    """Time of the first evaluation from which every later one stays >= ``target``."""
    t = None
    for point in curve:
        if point["test_acc"] >= target - EPS:
            if t is None:
                t = point[key]
        else:
            t = None
    return t


def first_crossing(curve: Sequence[dict], target: float, key: str = "wall_s") -> float | None:
    """Time of the first evaluation at or above ``target`` (for comparison only)."""
    for point in curve:
        if point["test_acc"] >= target - EPS:
            return point[key]
    return None


def frontier_at(points: Sequence[tuple[float, float]], t: float) -> tuple[float, str | None]:
    """The frontier's accuracy at wall-clock ``t``: piecewise linear through ``points``
    ((wall, accuracy), sorted here by wall); clamped to the first / last point outside
    their range, with ``"below"`` / ``"above"`` saying so (``None`` inside)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("no frontier points")
    if t < pts[0][0]:
        return pts[0][1], "below"
    if t > pts[-1][0]:
        return pts[-1][1], "above"
    for (w0, a0), (w1, a1) in zip(pts, pts[1:], strict=False):
        if w0 <= t <= w1:
            if w1 - w0 <= EPS:
                return max(a0, a1), None
            return a0 + (a1 - a0) * (t - w0) / (w1 - w0), None
    return pts[-1][1], None  # a single point, t equal to it


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or num <= 0 or den <= 0:
        return None
    return num / den


def paired(arm: dict, full: dict, frontier: Sequence[dict], key: str = "wall_s") -> dict:
    """The headline numbers of one run against the same seed's ``full`` and frontier runs
    (each a result dict with ``time_to_target_s``, ``final_test_acc`` and its total time
    under ``key``)."""
    reached = [r["time_to_target_s"] for r in frontier if r["time_to_target_s"] is not None]
    best = min(reached) if reached else None
    acc, clamped = frontier_at([(r[key], r["final_test_acc"]) for r in frontier], arm[key])
    return {
        "speedup_vs_full": _ratio(full["time_to_target_s"], arm["time_to_target_s"]),
        "speedup_vs_frontier": _ratio(best, arm["time_to_target_s"]),
        "frontier_best_time_to_target_s": best,
        "frontier_acc_at_wall": acc,
        "iso_time_gain": 100.0 * (arm["final_test_acc"] - acc),
        "iso_time_clamped": clamped,
        "final_acc_delta": 100.0 * (arm["final_test_acc"] - full["final_test_acc"]),
        "speedup_steps_vs_full": _ratio(full.get("steps_to_target"), arm.get("steps_to_target")),
    }


def predicted_speedup(arm: dict, full: dict, probe: dict | None) -> float | None:
    """``full``'s predicted cost to the target / the arm's (see the module docstring); None
    without a probe (records older than it) or where either did not reach the target."""
    if probe is None:
        return None

    def cost_to_target(r: dict) -> float | None:
        steps_to = r.get("steps_to_target")
        if steps_to is None or not r.get("steps"):
            return None
        per_run = r["backward_samples"] + probe["scoring_share_of_step"] * r["scoring_forward_samples"]
        return per_run * steps_to / r["steps"]

    return _ratio(cost_to_target(full), cost_to_target(arm))


def annotate_seed(results: dict[str, dict], target_drop: float, clock: str = "wall", probe: dict | None = None) -> None:
    """Adds target, time to target (on ``clock``) and the paired numbers to every arm's
    results of one seed (``results``: arm -> result dict, with its curve; ``probe``: the
    task run's step costs, for the predicted speedup)."""
    key = time_key(clock)
    full = results["full"]
    target = full["final_test_acc"] - target_drop / 100.0
    for r in results.values():
        r["clock"] = clock
        r["target_acc"] = round(target, 6)
        r["time_to_target_s"] = time_to_target(r["curve"], target, key)
        r["first_crossing_s"] = first_crossing(r["curve"], target, key)
        has_steps = all("steps" in point for point in r["curve"])
        r["steps_to_target"] = time_to_target(r["curve"], target, "steps") if has_steps else None
    frontier = [r for arm, r in results.items() if is_frontier(arm)]
    for r in results.values():
        r["paired"] = paired(r, full, frontier, key)
        r["paired"]["predicted_speedup"] = predicted_speedup(r, full, probe)


def reannotate(records: list[dict], clock: str) -> None:
    """Recomputes every run's paired numbers on ``clock`` from the curves, seed by seed
    (each record's own ``target_drop_points``)."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        groups.setdefault((r["task"], r["backend"], r["seed"]), {})[r["arm"]] = r
    for (task, backend, seed), runs in groups.items():
        if "full" not in runs:
            raise ValueError(f"{task} ({backend}) seed {seed}: no full run to pair with")
        config = runs["full"].get("config", {})
        drop = config.get("target_drop_points", 0.5)
        annotate_seed({arm: r["results"] for arm, r in runs.items()}, drop, clock, config.get("cost_probe"))


def grouped(records: list[dict], fields: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """The records by the values of ``fields``, groups and members in the records' order."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[f] for f in fields), []).append(r)
    return groups


def stat(values: Sequence[float | None]) -> tuple[float | None, float | None, float | None]:
    """(median, min, max) of the values that are not None; Nones when there are none."""
    v = [x for x in values if x is not None]
    if not v:
        return None, None, None
    return statistics.median(v), min(v), max(v)


def _metric(row: dict, key: str, values, digits: int = 4) -> None:
    med, lo, hi = stat(values)

    def rnd(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    row[key], row[key + "_min"], row[key + "_max"] = rnd(med), rnd(lo), rnd(hi)


def summarize(records: list[dict], clock: str | None = None) -> list[dict]:
    """One summary row per (task, backend, arm), in the order of the records; with
    ``clock``, the paired numbers are first recomputed on it (``reannotate``)."""
    if clock is not None:
        reannotate(records, clock)
    rows = []
    for (task, backend, arm), rs in grouped(records, ("task", "backend", "arm")).items():
        res = [r["results"] for r in rs]
        p = [x["paired"] for x in res]
        commits = sorted({str(r["versions"].get("commit")) for r in rs})
        row = {
            "task": task,
            "arm": arm,
            "backend": backend,
            "clock": res[0].get("clock", "wall"),
            "seeds": len(rs),
            "reached": sum(x["time_to_target_s"] is not None for x in res),
            "commit": commits[0] if len(commits) == 1 else ",".join(commits),
        }
        _metric(row, "speedup_vs_full", [x["speedup_vs_full"] for x in p], 3)
        _metric(row, "speedup_vs_frontier", [x["speedup_vs_frontier"] for x in p], 3)
        _metric(row, "speedup_steps_vs_full", [x.get("speedup_steps_vs_full") for x in p], 3)
        _metric(row, "predicted_speedup", [x.get("predicted_speedup") for x in p], 3)
        _metric(row, "iso_time_gain", [x["iso_time_gain"] for x in p], 3)
        row["iso_time_clamped"] = sum(x["iso_time_clamped"] is not None for x in p)
        _metric(row, "final_acc", [100.0 * x["final_test_acc"] for x in res], 3)
        _metric(row, "final_acc_delta", [x["final_acc_delta"] for x in p], 3)
        mean, ci = mean_ci95([x["final_acc_delta"] for x in p])
        row["final_acc_delta_mean"] = None if mean is None else round(mean, 3)
        row["final_acc_delta_ci95"] = None if ci is None else [round(ci[0], 3), round(ci[1], 3)]
        _metric(row, "time_to_target_s", [x["time_to_target_s"] for x in res], 3)
        _metric(row, "total_wall_s", [x["wall_s"] for x in res], 3)
        _metric(row, "total_cpu_s", [x.get("cpu_s") for x in res], 3)
        _metric(row, "bwd_samples", [x["backward_samples"] for x in res], 0)
        _metric(row, "fwd_samples", [x["forward_samples"] for x in res], 0)
        _metric(row, "kept_share", [x["kept_share"] for x in res], 4)
        _metric(row, "target_acc", [100.0 * x["target_acc"] for x in res], 3)
        if "mislabeled_share_trained" in res[0]:
            _metric(row, "mislabeled_share", [x["mislabeled_share_trained"] for x in res], 4)
        if "xla_compiles" in res[0]:
            _metric(row, "xla_compiles", [x["xla_compiles"] for x in res], 0)
            _metric(row, "xla_host_reads_per_step", [x["xla_host_reads_per_step"] for x in res], 3)
        rows.append(row)
    return rows


def fmt(row: dict, key: str, spec: str) -> str:
    """'median [min, max]' of a summary metric; '-' when undefined. Spec "s": seconds."""
    med = row.get(key)
    if med is None:
        return "-"
    lo, hi = row.get(key + "_min"), row.get(key + "_max")
    if spec == "s":
        spec = ".2f" if (med if hi is None else hi) < 10 else ".1f"
    if row["seeds"] == 1 or lo == hi:
        return format(med, spec)
    return f"{format(med, spec)} [{format(lo, spec)}, {format(hi, spec)}]"


HEADLINE = [
    ("reached", "reached", None),
    ("speedup_vs_full", "speedup vs full", ".2f"),
    ("speedup_vs_frontier", "speedup vs frontier", ".2f"),
    ("iso_time_gain", "iso-time gain (pts)", "+.2f"),
    ("final_acc", "final acc %", ".2f"),
    ("final_acc_delta", "acc vs full (pts)", "+.2f"),
    ("final_acc_delta_mean", "acc vs full, mean", "+.2f"),
    ("final_acc_delta_ci95", "95% CI (pts)", "+.2f"),
    ("total_time", "total time s", "s"),  # on the table's clock: total_wall_s or total_cpu_s
    ("bwd_samples", "bwd samples", ".0f"),
    ("kept_share", "kept share", ".3f"),
]
DETAIL = [
    ("speedup_steps_vs_full", "speedup in steps vs full", ".2f"),
    ("predicted_speedup", "predicted speedup", ".2f"),
    ("time_to_target_s", "time to target s", "s"),
    ("total_other", "total time s, other clock", "s"),  # the other one
    ("fwd_samples", "fwd samples", ".0f"),
    ("mislabeled_share", "mislabeled share of trained", ".3f"),
    ("xla_compiles", "compiles", ".0f"),
    ("xla_host_reads_per_step", "host reads/step", ".2f"),
]


def _cell(row: dict, key: str, spec: str | None) -> str:
    if key == "reached":
        return f"{row['reached']}/{row['seeds']}"
    if spec is None:
        raise ValueError(f"column {key!r}: only 'reached' is formatted without a spec")
    if key == "final_acc_delta_mean":
        return "-" if row.get(key) is None else format(row[key], spec)
    if key == "final_acc_delta_ci95":
        ci = row.get(key)
        return "-" if ci is None else f"[{format(ci[0], spec)}, {format(ci[1], spec)}]"
    if key == "iso_time_gain" and row.get("iso_time_clamped"):
        return fmt(row, key, spec) + f" (clamped {row['iso_time_clamped']})"
    return fmt(row, key, spec)


def format_tables(rows: list[dict], markdown: bool = False, columns=None) -> str:
    """The headline table per task (or ``columns``), median [min, max] over seeds."""
    columns = columns or HEADLINE
    out, groups = [], []
    for r in rows:
        if (r["task"], r["backend"]) not in groups:
            groups.append((r["task"], r["backend"]))
    for task, backend in groups:
        rs = [r for r in rows if (r["task"], r["backend"]) == (task, backend)]
        cpu = rs[0].get("clock") == "cpu"
        own, other = ("total_cpu_s", "total_wall_s") if cpu else ("total_wall_s", "total_cpu_s")
        alias = {
            "total_time": (own, f"total {'cpu' if cpu else 'wall'} s"),
            "total_other": (other, f"total {'wall' if cpu else 'cpu'} s"),
        }
        columns_here = [(alias[k][0], alias[k][1], sp) if k in alias else (k, h, sp) for k, h, sp in columns]
        cols = [("arm", "arm", None)] + [c for c in columns_here if c[0] == "reached" or c[0] in rs[0]]
        full = next((r for r in rs if r["arm"] == "full"), rs[0])
        title = (
            f"{task} ({backend}), {full['seeds']} seed(s), times on the {full['clock']} clock, "
            f"target = full's final accuracy - drop: {fmt(full, 'target_acc', '.2f')} %"
        )
        cells = [[r["arm"] if k == "arm" else _cell(r, k, s) for k, _, s in cols] for r in rs]
        if markdown:
            out.append(f"**{title}**\n")
            out.append("| " + " | ".join(h for _, h, _ in cols) + " |")
            out.append("|" + "|".join(" --- " for _ in cols) + "|")
            out.extend("| " + " | ".join(c) + " |" for c in cells)
        else:
            out.append(title)
            out += text_table([h for _, h, _ in cols], cells)
        out.append("")
    return "\n".join(out)


def text_table(heads: list[str], cells: list[list[str]]) -> list[str]:
    """The lines of a plain-text table: the heads, a rule, the rows, columns padded to width."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    out = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)), "  ".join("-" * w for w in widths)]
    out.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells)
    return out
