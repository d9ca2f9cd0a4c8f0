"""The memory benchmark runs end to end at a tiny size (its full run is in the README)."""

import json
import os
import subprocess
import sys

from tests.helpers.subprocess_limits import LIMIT_S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_memory_benchmark_runs_and_reports(tmp_path):
    out = tmp_path / "mem.jsonl"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "memory.py"),
        "--batches",
        "600",
        "--every",
        "200",
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["mode"] for r in records] == ["probabilistic", "fixed"]
    for r in records:
        assert r["source_batches"] == 600
        assert len(r["samples"]) == 3 and r["rss_final_mb"] > 0
        assert r["rss_max_growth_mb"] < 50  # a leak of this size would show even in 600 batches
