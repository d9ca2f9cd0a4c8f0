"""The suite's output files: ``runs.jsonl`` (one line per run, appended) and
``summary.jsonl`` (one line per task, backend and arm, replaced; its rows come from
``report.summary.summarize``, its schema is in ``report/summary.py``)."""

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def run_record(
    task: str, arm: str, seed: int, backend: dict[str, Any], vers: dict, config: dict, results: dict
) -> dict:
    """One line of ``runs.jsonl``: the run's task, arm, seed, backend, device, time, versions,
    config and results (with its curve and paired numbers)."""
    return {
        "task": task,
        "arm": arm,
        "seed": seed,
        "backend": backend["name"],
        "device": backend["device_desc"],
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": vers,
        "config": config,
        "results": results,
    }


def append_record(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_records(path: Path) -> list[dict]:
    """The runs of a ``runs.jsonl`` file, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_summary(rows: list[dict], path: Path) -> None:
    """``summary.jsonl``: replaced, one line per row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
