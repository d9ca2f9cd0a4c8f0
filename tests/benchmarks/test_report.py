"""The suite's arithmetic (benchmarks/report/summary.py) on hand-made curves with known answers."""

import math

import pytest

from benchmarks.report import summary as report


def curve(*points):
    return [{"wall_s": w, "test_acc": a} for w, a in points]


def run(points, wall=None, final=None):
    c = curve(*points)
    return {
        "curve": c,
        "wall_s": wall if wall is not None else c[-1]["wall_s"],
        "final_test_acc": final if final is not None else c[-1]["test_acc"],
    }


def test_time_to_target_is_the_first_evaluation_from_which_every_later_one_stays_above():
    c = curve((0, 0.1), (1, 0.91), (2, 0.89), (3, 0.92), (4, 0.93))
    assert report.time_to_target(c, 0.90) == 3  # the crossing at 1 s does not last
    assert report.first_crossing(c, 0.90) == 1
    assert report.time_to_target(c, 0.925) == 4
    assert report.time_to_target(c, 0.94) is None  # the final evaluation is below
    assert report.time_to_target(c, 0.05) == 0  # at or above from the start
    assert report.time_to_target(curve((0, 0.5), (1, 0.9), (2, 0.9)), 0.9) == 1  # "at" counts


def test_a_dip_at_the_end_means_never():
    c = curve((0, 0.1), (1, 0.95), (2, 0.96), (3, 0.949))
    assert report.time_to_target(c, 0.95) is None
    assert report.first_crossing(c, 0.95) == 1


def test_frontier_is_piecewise_linear_and_clamped_outside_its_range():
    pts = [(10.0, 0.90), (20.0, 0.96), (5.0, 0.80)]  # unsorted on purpose
    assert report.frontier_at(pts, 5.0) == (0.80, None)
    assert report.frontier_at(pts, 7.5) == (pytest.approx(0.85), None)
    assert report.frontier_at(pts, 15.0) == (pytest.approx(0.93), None)
    assert report.frontier_at(pts, 20.0) == (pytest.approx(0.96), None)
    assert report.frontier_at(pts, 2.0) == (0.80, "below")
    assert report.frontier_at(pts, 25.0) == (0.96, "above")
    assert report.frontier_at([(3.0, 0.7)], 3.0) == (0.7, None)
    assert report.frontier_at([(3.0, 0.7), (3.0, 0.8)], 3.0) == (0.8, None)  # equal walls: the better one
    with pytest.raises(ValueError):
        report.frontier_at([], 1.0)


def test_paired_numbers_of_a_seed():
    # full: 4 evaluations, final 0.96 at 20 s, target 0.955 -> reached (and stays) at 15 s
    results = {
        "full": run([(0, 0.1), (5, 0.90), (10, 0.94), (15, 0.956), (20, 0.96)]),
        "full@0.5": run([(0, 0.1), (5, 0.93), (10, 0.957)]),  # reaches the target at 10 s
        "arm": run([(0, 0.1), (4, 0.958), (8, 0.954), (12, 0.961)]),  # reaches (for good) at 12 s
        "slow": run([(0, 0.1), (30, 0.95)]),  # never: 0.95 < 0.955
    }
    report.annotate_seed(results, target_drop=0.5)
    for r in results.values():
        assert r["target_acc"] == pytest.approx(0.955)
    assert results["full"]["time_to_target_s"] == 15 and results["full@0.5"]["time_to_target_s"] == 10
    a = results["arm"]["paired"]
    assert results["arm"]["time_to_target_s"] == 12 and results["arm"]["first_crossing_s"] == 4
    assert a["speedup_vs_full"] == pytest.approx(15 / 12)
    assert a["speedup_vs_frontier"] == pytest.approx(10 / 12)  # the fastest frontier run: full@0.5
    # frontier through (10 s, 0.957) and (20 s, 0.96): at 12 s, 0.9576
    assert a["frontier_acc_at_wall"] == pytest.approx(0.9576)
    assert a["iso_time_gain"] == pytest.approx(100 * (0.961 - 0.9576))
    assert a["iso_time_clamped"] is None
    assert a["final_acc_delta"] == pytest.approx(100 * (0.961 - 0.96))
    s = results["slow"]["paired"]
    assert s["speedup_vs_full"] is None and s["speedup_vs_frontier"] is None
    assert s["iso_time_clamped"] == "above" and s["iso_time_gain"] == pytest.approx(100 * (0.95 - 0.96))
    f = results["full"]["paired"]
    assert f["speedup_vs_full"] == 1.0 and f["iso_time_gain"] == pytest.approx(0.0) and f["final_acc_delta"] == 0.0
    assert f["speedup_vs_frontier"] == pytest.approx(10 / 15)


def test_speedup_in_steps_counts_the_steps_to_the_target_whatever_the_clock_says():
    """Two runs of the same work on a noisy clock: the steps to the target are the same, the
    times are not; the step speedup follows the steps only."""

    def stepped(points):
        c = [{"wall_s": w, "steps": n, "test_acc": a} for w, n, a in points]
        n = c[-1]["steps"]
        return {
            "curve": c,
            "wall_s": c[-1]["wall_s"],
            "cpu_s": c[-1]["wall_s"],
            "final_test_acc": c[-1]["test_acc"],
            "backward_samples": n,
            "forward_samples": n,
            "kept_share": 1.0,
        }

    results = {
        "full": stepped([(0, 0, 0.1), (10, 100, 0.94), (20, 200, 0.956), (30, 300, 0.96)]),
        # reaches the target for good after 100 steps, but its clock ran slow: 18 s
        "arm": stepped([(0, 0, 0.1), (18, 100, 0.957), (26, 150, 0.96)]),
        "never": stepped([(0, 0, 0.1), (5, 100, 0.95)]),
    }
    report.annotate_seed(results, target_drop=0.5)
    a = results["arm"]["paired"]
    assert results["arm"]["steps_to_target"] == 100 and results["full"]["steps_to_target"] == 200
    assert a["speedup_steps_vs_full"] == pytest.approx(2.0)
    assert a["speedup_vs_full"] == pytest.approx(20 / 18)
    assert results["never"]["paired"]["speedup_steps_vs_full"] is None
    # curves without step counts (older records) have no step speedup rather than a wrong one
    old = {"full": run([(0, 0.1), (10, 0.96)]), "arm": run([(0, 0.1), (5, 0.96)])}
    report.annotate_seed(old, target_drop=0.5)
    assert old["arm"]["paired"]["speedup_steps_vs_full"] is None
    rows = report.summarize([_record(arm, 0, res) for arm, res in results.items()])
    assert {r["arm"]: r["speedup_steps_vs_full"] for r in rows} == {"full": 1.0, "arm": 2.0, "never": None}
    assert "speedup in steps vs full" in report.format_tables(rows, markdown=True, columns=report.DETAIL)


def test_the_predicted_speedup_is_the_cost_models_from_the_sample_counts_by_hand():
    """A trained sample costs 1, a scored one the probe's scoring share (0.3 here); each run
    spends its samples up to the target in proportion to its steps there."""

    def counted(steps, to_target, backward, scoring):
        curve = [
            {"wall_s": 0.0, "steps": 0, "test_acc": 0.1},
            {"wall_s": float(to_target), "steps": to_target, "test_acc": 0.96},
            {"wall_s": float(steps), "steps": steps, "test_acc": 0.96},
        ]
        return {
            "curve": curve,
            "wall_s": float(steps),
            "cpu_s": float(steps),
            "final_test_acc": 0.96,
            "steps": steps,
            "backward_samples": backward,
            "scoring_forward_samples": scoring,
            "forward_samples": backward + scoring,
            "kept_share": 1.0,
        }

    probe = {"scoring_share_of_step": 0.3}
    results = {
        "full": counted(300, 200, 3000, 0),  # 3000 * 200 / 300 = 2000 to the target
        "per-batch": counted(300, 100, 3000, 6000),  # (3000 + 0.3 * 6000) * 100 / 300 = 1600
        "epoch-level": counted(180, 120, 1800, 0),  # 1800 * 120 / 180 = 1200: its speedup in steps
    }
    report.annotate_seed(results, target_drop=0.5, probe=probe)
    predicted = {arm: r["paired"]["predicted_speedup"] for arm, r in results.items()}
    assert predicted == pytest.approx({"full": 1.0, "per-batch": 1.25, "epoch-level": 2000 / 1200})
    assert predicted["epoch-level"] == pytest.approx(results["epoch-level"]["paired"]["speedup_steps_vs_full"])
    report.annotate_seed(results, target_drop=0.5)  # records without a probe predict nothing
    assert all(r["paired"]["predicted_speedup"] is None for r in results.values())
    # the summary reads the probe from the records' config
    records = [{**_record(arm, 0, res), "config": {"cost_probe": probe}} for arm, res in results.items()]
    rows = report.summarize(records, clock="wall")
    assert {r["arm"]: r["predicted_speedup"] for r in rows} == {"full": 1.0, "per-batch": 1.25, "epoch-level": 1.667}
    assert "predicted speedup" in report.format_tables(rows, columns=report.DETAIL)


def _record(arm, seed, res, commit="abc"):
    return {"task": "t", "backend": "eager", "arm": arm, "seed": seed, "versions": {"commit": commit}, "results": res}


def test_summary_medians_ranges_and_reached_counts():
    records = []
    for seed, (arm_points, full_final) in enumerate(
        [
            ([(0, 0.1), (6, 0.97)], 0.97),  # reaches at 6 s; full at 10 s -> 10/6
            ([(0, 0.1), (5, 0.96)], 0.97),  # never (0.96 < 0.965)
            ([(0, 0.1), (4, 0.975)], 0.97),  # reaches at 4 s -> 10/4
        ]
    ):
        results = {"full": run([(0, 0.1), (10, full_final)]), "arm": run(arm_points)}
        for r in results.values():
            r.update(backward_samples=100, forward_samples=100, kept_share=1.0)
        report.annotate_seed(results, 0.5)
        records += [_record(a, seed, r) for a, r in results.items()]
    rows = {r["arm"]: r for r in report.summarize(records)}
    arm = rows["arm"]
    assert arm["seeds"] == 3 and arm["reached"] == 2 and arm["commit"] == "abc"
    assert arm["speedup_vs_full"] == pytest.approx(statistics_median([10 / 6, 10 / 4]), abs=1e-3)
    assert arm["speedup_vs_full_min"] == pytest.approx(10 / 6, abs=1e-3)
    assert arm["speedup_vs_full_max"] == pytest.approx(2.5)
    assert arm["final_acc"] == pytest.approx(97.0) and arm["final_acc_min"] == pytest.approx(96.0)
    assert arm["final_acc_delta"] == pytest.approx(0.0) and arm["final_acc_delta_max"] == pytest.approx(0.5)
    # the arm's wall (4-6 s) is below the frontier's only point (10 s): clamped, every seed
    assert arm["iso_time_clamped"] == 3
    assert rows["full"]["reached"] == 3 and rows["full"]["speedup_vs_full"] == 1.0
    for key in (
        "task",
        "arm",
        "backend",
        "seeds",
        "reached",
        "speedup_vs_full",
        "speedup_vs_frontier",
        "iso_time_gain",
        "final_acc",
        "final_acc_delta",
        "total_wall_s",
        "bwd_samples",
        "kept_share",
        "commit",
    ):
        assert key in arm
    # a metric no seed defines is null, with its range
    undefined = {**records[3]["results"]["paired"], "speedup_vs_full": None, "speedup_vs_frontier": None}
    never = report.summarize(
        [_record("arm", 0, {**records[3]["results"], "paired": undefined, "time_to_target_s": None})]
    )[0]
    assert never["reached"] == 0 and never["speedup_vs_full"] is None and never["speedup_vs_full_min"] is None
    table = report.format_tables(list(rows.values()))
    assert "speedup vs frontier" in table and "2/3" in table


def statistics_median(v):
    import statistics

    return statistics.median(v)


def test_student_t_quantiles_match_the_tables():
    from benchmarks.report import confidence

    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 29: 2.045, 30: 2.042, 120: 1.980}
    for df, t in table.items():
        assert confidence.t_quantile(0.95, df) == pytest.approx(t, abs=5e-4), df
    assert confidence.t_quantile(0.95, 10_000) == pytest.approx(1.9602, abs=1e-4)  # near the normal's 1.96
    assert confidence.t_quantile(0.90, 1) == pytest.approx(6.314, abs=5e-4)
    # the closed forms of df = 1 (Cauchy) and df = 2
    for t in (0.3, 1.0, 7.5):
        assert confidence.t_two_sided_mass(t, 1) == pytest.approx(2 / math.pi * math.atan(t))
        assert confidence.t_two_sided_mass(t, 2) == pytest.approx(t / math.sqrt(2 + t * t))
    assert confidence.t_two_sided_mass(0.0, 7) == 0.0 and confidence.t_two_sided_mass(-2.0, 7) > 0.9
    with pytest.raises(ValueError):
        confidence.t_quantile(0.95, 0)
    with pytest.raises(ValueError):
        confidence.t_quantile(1.0, 3)


def test_mean_and_95_interval_of_paired_differences_by_hand():
    from benchmarks.report import confidence

    mean, ci = confidence.mean_ci95([1.0, 2.0, 3.0])  # sd 1, t_{0.975, 2} = 4.303
    assert mean == 2.0
    assert ci == [
        pytest.approx(2 - 4.3027 / math.sqrt(3), abs=1e-3),
        pytest.approx(2 + 4.3027 / math.sqrt(3), abs=1e-3),
    ]
    mean, ci = confidence.mean_ci95([-0.5, 0.5, None, 0.1, -0.1])  # None: a seed without the value
    assert mean == pytest.approx(0.0) and ci[0] == pytest.approx(-ci[1])
    sd = math.sqrt((0.25 + 0.25 + 0.01 + 0.01) / 3)
    assert ci[1] == pytest.approx(3.1824 * sd / 2, abs=1e-3)
    assert confidence.mean_ci95([0.7]) == (0.7, None)  # one seed: no interval
    assert confidence.mean_ci95([]) == (None, None)
    assert confidence.mean_ci95([0.0, 0.0]) == (0.0, [0.0, 0.0])


def _three_seeds():
    """Three seeds of full and one arm whose final accuracy is full's +1, +2, +3 points."""
    records = []
    for seed, delta in enumerate((0.01, 0.02, 0.03)):
        results = {"full": run([(0, 0.1), (10, 0.90)]), "arm": run([(0, 0.1), (5, 0.90 + delta)])}
        for r in results.values():
            r.update(backward_samples=100, forward_samples=100, kept_share=1.0)
        report.annotate_seed(results, 0.5)
        records += [_record(a, seed, r) for a, r in results.items()]
    return records


def test_summary_has_the_paired_mean_and_interval_in_the_file_and_the_table(tmp_path):
    import json

    from benchmarks.instruments import records as records_module

    records = _three_seeds()
    rows = {r["arm"]: r for r in report.summarize(records)}
    arm, full = rows["arm"], rows["full"]
    assert arm["final_acc_delta_mean"] == pytest.approx(2.0)
    half = 4.3027 / math.sqrt(3)
    assert arm["final_acc_delta_ci95"] == [pytest.approx(2 - half, abs=2e-3), pytest.approx(2 + half, abs=2e-3)]
    assert full["final_acc_delta_mean"] == 0.0 and full["final_acc_delta_ci95"] == [0.0, 0.0]
    path = tmp_path / "summary.jsonl"
    records_module.write_summary(list(rows.values()), path)
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert written[1]["arm"] == "arm" and written[1]["final_acc_delta_ci95"] == arm["final_acc_delta_ci95"]
    table = report.format_tables(list(rows.values()))
    assert "acc vs full, mean" in table and "95% CI (pts)" in table
    assert f"[{2 - half:+.2f}, {2 + half:+.2f}]" in table and "+2.00" in table
    one = {r["arm"]: r for r in report.summarize(records[:2])}["arm"]  # one seed
    assert one["final_acc_delta_mean"] == pytest.approx(1.0) and one["final_acc_delta_ci95"] is None
    lines = [line for line in report.format_tables([one], markdown=True).splitlines() if line.startswith("|")]
    header, row = [c.strip() for c in lines[0].split("|")], [c.strip() for c in lines[-1].split("|")]
    assert row[header.index("95% CI (pts)")] == "-" and row[header.index("acc vs full, mean")] == "+1.00"
