"""What ``benchmarks/scale.py`` makes of its rows: one printed line per measurement, a fit
of each (path, ranks)'s planning time against N projected to N = 1e9, the plot, and the
latest rows of a records file (``--plot-only``). The measurements are the script's.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np


def fit(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Slope and intercept of log10(seconds) against log10(N)."""
    x = np.log10([r["n"] for r in rows])
    y = np.log10([max(r["seconds_median"], 1e-9) for r in rows])
    slope, intercept = np.polyfit(x, y, 1) if len(rows) > 1 else (float("nan"), float(y[0]))
    return float(slope), float(intercept)


def show(r: dict[str, Any]) -> None:
    print(
        f"{r['path']:8} N={r['n']:>11,} W={r['ranks']}  plan {r['seconds_median']:8.3f} s "
        f"[{r['seconds_range'][0]:.3f}, {r['seconds_range'][1]:.3f}]  peak +{r['peak_added_bytes'] / 2**20:8.1f} MiB  "
        f"held {r['held_bytes_per_owned']:5.2f} B/owned ({r['held_steady_bytes_per_owned']:5.2f} once training)  "
        f"collective {r['collective_bytes']:>10,} B  rank error {r['rank_error']:.2e}  "
        f"plan/epoch {100 * r['plan_share_of_epoch']:.3f}%",
        flush=True,
    )


def report(rows: list[dict[str, Any]], train_us: float) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Fits each (path, W)'s rows, projects them to N = 1e9 and adds both to the rows."""
    print(f"\nassumed training time: {train_us} us per sample per rank")
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["path"], r["ranks"], r["n"])):
        groups.setdefault((r["path"], r["ranks"]), []).append(r)
    for (path, w), group in groups.items():
        slope, intercept = fit(group)
        projected = 10 ** (intercept + slope * 9)
        share = projected / ((1e9 / w) * train_us * 1e-6)
        span = f"N={group[0]['n']:.0e}..{group[-1]['n']:.0e}"
        print(
            f"{path:8} W={w}: time ~ N^{slope:.2f} ({span}); "
            f"projected at N=1e9: {projected:.1f} s ({100 * share:.3f}% of an epoch)"
        )
        for r in group:
            r.update({"growth_exponent": slope, "projected_1e9_seconds": projected})
    return groups


def latest_rows(path: Path) -> list[dict[str, Any]]:
    """The last row recorded in ``path`` for each (path, N, ranks)."""
    last: dict[tuple[str, int, int], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            last[(r["path"], r["n"], r["ranks"])] = r
    return list(last.values())


def plot(groups: dict[tuple[str, int], list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for (name, w), group in groups.items():
        ns = [r["n"] for r in group]
        label = f"{name} (W={w})"
        a.loglog(ns, [r["seconds_median"] for r in group], "o-", label=label)
        b.loglog(ns, [max(r["peak_added_bytes"], 1) / 2**20 for r in group], "o-", label=label)
    a.set(xlabel="N (samples)", ylabel="planning time per epoch (s, per rank)")
    b.set(xlabel="N (samples)", ylabel="peak memory added by planning (MiB, per rank)")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
