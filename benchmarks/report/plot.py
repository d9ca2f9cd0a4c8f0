"""The suite's plot (``accuracy_vs_time.png``): per task, every run's accuracy against time
with the frontier, and a panel of the speedups and the iso-time gain per arm.

The frontier is drawn as one line through the median over seeds of each ``full@X`` run's
end point (time and final accuracy), in the order of X, whiskers min and max over seeds:
one line a reader can follow, where a line per seed in one colour crossed the others.
The arms' labels under the speedup panel are slanted so that long names do not overlap.
"""

import statistics
from pathlib import Path

from benchmarks.report.summary import is_frontier, time_key


def frontier_fraction(arm: str) -> float:
    """X of a frontier arm ``full@X``; ``full`` is ``full@1``."""
    if not is_frontier(arm):
        raise ValueError(f"{arm!r} is not a frontier arm (full or full@X)")
    return 1.0 if arm == "full" else float(arm.split("@", 1)[1])


def frontier_medians(runs: list[dict], key: str) -> list[dict]:
    """Per frontier arm of ``runs`` (one task and backend), in the order of its fraction: the
    median, min and max over seeds of the run's total time (``key``) and final accuracy (%)."""
    out = []
    for arm in sorted({r["arm"] for r in runs if is_frontier(r["arm"])}, key=frontier_fraction):
        times = [r["results"][key] for r in runs if r["arm"] == arm]
        accs = [100 * r["results"]["final_test_acc"] for r in runs if r["arm"] == arm]
        out.append(
            {
                "arm": arm,
                "time": statistics.median(times),
                "time_range": (min(times), max(times)),
                "acc": statistics.median(accs),
                "acc_range": (min(accs), max(accs)),
            }
        )
    return out


ARM_COLORS = {
    "full": "black",
    "uniform": "tab:brown",
    "sift-probabilistic": "tab:blue",
    "sift-fixed": "tab:orange",
    "infobatch": "tab:green",
    "epoch": "tab:red",
    "dynamic-random": "tab:purple",
    "seta": "tab:olive",
    "seta-aggressive": "tab:cyan",
}
FRONTIER_COLORS = {"full@0.4": "#bbbbbb", "full@0.6": "#999999", "full@0.8": "#666666"}


def plot(records: list[dict], rows: list[dict], path: Path) -> None:
    """Per task: accuracy against time of every run with the frontier (the median over seeds
    of its runs' end points), and the speedups and iso-time gain per arm (median, whiskers:
    min and max over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = []
    for r in records:
        if (r["task"], r["backend"]) not in groups:
            groups.append((r["task"], r["backend"]))
    fig, axes = plt.subplots(len(groups), 2, figsize=(14, 4.8 * len(groups)), squeeze=False)
    palette = plt.get_cmap("tab10")
    for (ax, bx), (task, backend) in zip(axes, groups, strict=True):
        rs = [r for r in records if (r["task"], r["backend"]) == (task, backend)]
        clock = rs[0]["results"].get("clock", "wall")
        key = time_key(clock)
        arms = list(dict.fromkeys(r["arm"] for r in rs))
        colors = {a: ARM_COLORS.get(a) or FRONTIER_COLORS.get(a) or palette((i + 5) % 10) for i, a in enumerate(arms)}
        for arm in arms:
            for i, r in enumerate(x for x in rs if x["arm"] == arm):
                c = r["results"]["curve"]
                ax.plot(
                    [p[key] for p in c],
                    [100 * p["test_acc"] for p in c],
                    color=colors[arm],
                    alpha=0.75,
                    lw=1.0,
                    label=arm if i == 0 else None,
                )
        front = frontier_medians(rs, key)
        if front:
            ax.errorbar(
                [f["time"] for f in front],
                [f["acc"] for f in front],
                xerr=[[f["time"] - f["time_range"][0] for f in front], [f["time_range"][1] - f["time"] for f in front]],
                yerr=[[f["acc"] - f["acc_range"][0] for f in front], [f["acc_range"][1] - f["acc"] for f in front]],
                color="red",
                marker="o",
                ms=5,
                lw=2.0,
                capsize=2,
                elinewidth=0.8,
                zorder=5,
                label="frontier: full@x end points, median over seeds",
            )
            at: dict[tuple[float, float], list[str]] = {}  # runs of equal length end at one point: one label
            for f in front:
                at.setdefault((f["time"], f["acc"]), []).append(f["arm"])
            for point, names in at.items():
                ax.annotate(
                    " = ".join(names), point, textcoords="offset points", xytext=(4, -10), fontsize=7, color="red"
                )
        targets = [100 * r["results"]["target_acc"] for r in rs]
        ax.axhline(statistics.median(targets), color="red", ls=":", lw=0.8, label="target (median)")
        finals = [100 * r["results"]["final_test_acc"] for r in rs]
        ax.set_ylim(max(0.0, min(finals) - 10), min(100.0, max(finals) + 1.5))
        ax.set_xlabel(f"training time s, {clock} clock (evaluation excluded)")
        ax.set_ylabel("test accuracy %")
        ax.set_title(f"{task} ({backend}): accuracy against time, every run; frontier: median over seeds", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=7, ncol=2)

        srows = [r for r in rows if (r["task"], r["backend"]) == (task, backend)]
        xs = list(range(len(srows)))
        for off, key, marker, label in (
            (-0.15, "speedup_vs_full", "o", "speedup vs full"),
            (0.0, "speedup_vs_frontier", "s", "speedup vs frontier"),
        ):
            first = next((x for x, r in zip(xs, srows, strict=True) if r.get(key) is not None), None)
            for x, r in zip(xs, srows, strict=True):
                if r.get(key) is None:
                    continue
                bx.errorbar(
                    x + off,
                    r[key],
                    yerr=[[r[key] - r[key + "_min"]], [r[key + "_max"] - r[key]]],
                    fmt=marker,
                    color="tab:blue" if key == "speedup_vs_full" else "tab:purple",
                    capsize=3,
                    label=label if x == first else None,
                )
        bx.axhline(1.0, color="gray", lw=0.8)
        bx.set_ylabel("speedup (time to target), seeds that reached it")
        gx = bx.twinx()
        for x, r in zip(xs, srows, strict=True):
            gx.errorbar(
                x + 0.15,
                r["iso_time_gain"],
                yerr=[[r["iso_time_gain"] - r["iso_time_gain_min"]], [r["iso_time_gain_max"] - r["iso_time_gain"]]],
                fmt="D",
                color="tab:green",
                capsize=3,
                label="iso-time gain" if x == 0 else None,
            )
        gx.axhline(0.0, color="tab:green", lw=0.6, ls=":")
        gx.set_ylabel("iso-time gain, points (vs the frontier at the arm's time)", color="tab:green")
        bx.set_xticks(xs)
        bx.set_xticklabels(
            [f"{r['arm']} ({r['reached']}/{r['seeds']})" for r in srows], fontsize=8, rotation=35, ha="right"
        )
        bx.set_xlim(-0.6, len(srows) - 0.4)
        bx.set_title(f"{task}: median, whiskers min-max over seeds; (n/m): seeds that reached the target", fontsize=9)
        bx.grid(alpha=0.3)
        h1, l1 = bx.get_legend_handles_labels()
        h2, l2 = gx.get_legend_handles_labels()
        bx.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
