"""The single-pass language-model task (``benchmarks/lm_suite.py``): the entry script at a
tiny size, the SelectiveBackprop peer's rule, and the
corpus's split and checksum (a corpus whose held-out files leak into training, or whose
checksum moves between reads, would make every record's loss meaningless)."""

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import lm_suite, suite
from benchmarks.arms.selective_backprop import is_active, keep_count, select, selection_probabilities
from benchmarks.arms.single_pass import SCORERS
from benchmarks.report.lm_summary import summarize_lm
from benchmarks.tasks.lm_corpus import HELDOUT_EVERY, corpus_files, read_corpus, stream_order
from tests.helpers.subprocess_limits import LIMIT_S

REPO = Path(__file__).resolve().parents[2]
ARMS = "lm-full,lm-full@0.4,lm-uniform,lm-sift-probabilistic,lm-sift-fixed-b2,lm-selective-backprop,lm-sift-probabilistic-bf16"


def _records(out: Path) -> dict[tuple[str, int], dict]:
    lines = (out / "runs.jsonl").read_text().splitlines()
    return {(r["arm"], r["seed"]): r for r in map(json.loads, lines)}


def test_a_tiny_run_pairs_every_arm_with_full_and_accounts_for_its_costs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lm_suite.py"), "--tiny", "--seeds", "0,1", "--arms", ARMS]
        + ["--out", str(tmp_path), "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert proc.returncode == 0, proc.stderr
    runs = _records(tmp_path)
    assert set(runs) == {(a, s) for a in ARMS.split(",") for s in (0, 1)}
    full = runs[("lm-full", 0)]
    steps, batch = full["config"]["steps"], full["config"]["batch_size"]
    for r in runs.values():
        res, cfg = r["results"], r["config"]
        assert cfg["corpus"]["sha256"] == full["config"]["corpus"]["sha256"] and cfg["corpus"]["bytes"] > 0
        assert cfg["corpus_option"] == "clean" and cfg["corpus"]["name"] == "clean"
        probe = cfg["cost_probe"]
        assert 0 < probe["scoring_share_of_step"] and probe["backward_to_forward"] > 0 and probe["clock"] == "cpu"
        assert r["device"].startswith("cpu")
        assert res["forward_samples"] == res["backward_samples"] + res["scoring_forward_samples"]
        parts = res["parts_s"]["cpu"]
        assert all(v >= 0 for v in parts.values())
        assert sum(parts.values()) == pytest.approx(res["cpu_s"], abs=2e-3)  # data path: the rest of the run
        assert res["target_bpb"] == pytest.approx(runs[("lm-full", r["seed"])]["results"]["final_bpb"] + 0.02)
    # The same steps for every arm but the frontier run; an arm that drops samples reads further.
    assert full["results"]["backward_samples"] == full["results"]["source_samples_read"] == steps * batch
    assert runs[("lm-full@0.4", 0)]["results"]["steps"] == math.ceil(0.4 * steps)
    for arm in ("lm-uniform", "lm-sift-probabilistic", "lm-sift-fixed-b2", "lm-sift-probabilistic-bf16"):
        res = runs[(arm, 0)]["results"]
        assert res["steps"] == steps and res["backward_samples"] == steps * batch
        assert res["source_samples_read"] > steps * batch
    assert runs[("lm-sift-fixed-b2", 0)]["results"]["scoring_forward_samples"] > 0
    assert runs[("lm-uniform", 0)]["results"]["scoring_forward_samples"] == 0
    assert runs[("lm-sift-probabilistic", 0)]["results"]["scoring_precision"] == "model"
    assert runs[("lm-sift-probabilistic-bf16", 0)]["results"]["scoring_precision"] == "bfloat16"
    sb = runs[("lm-selective-backprop", 0)]["results"]
    assert sb["source_samples_read"] == steps * batch and 0 < steps * batch - sb["backward_samples"] < steps * batch
    assert sb["sb_selected_steps"] > 0 and sb["scoring_forward_samples"] == sb["sb_selected_steps"] * batch
    printed = proc.stdout
    assert "backward+optimizer / forward" in printed and "predicted speedup" in printed
    assert "do not apply to a single pass" in printed and "sha256" in printed
    assert (tmp_path / "summary.jsonl").exists()
    again = tmp_path / "again"
    assert lm_suite.main(["--summarize", str(tmp_path / "runs.jsonl"), "--out", str(again)]) == 0
    rows = [json.loads(line) for line in (again / "summary.jsonl").read_text().splitlines()]
    assert [r["arm"] for r in rows] == ARMS.split(",") and all(r["seeds"] == 2 for r in rows)


def test_a_tiny_run_on_the_web_like_stream_records_it_and_keeps_the_clean_held_out_set(tmp_path):
    arms = "lm-full,lm-sift-probabilistic," + ",".join(SCORERS)
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lm_suite.py"), "--tiny", "--corpus", "web", "--seeds", "0"]
        + ["--arms", arms, "--out", str(tmp_path), "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lm: corpus web-like," in proc.stdout
    runs = _records(tmp_path)
    assert set(runs) == {(a, 0) for a in arms.split(",")}
    clean = read_corpus(lm_suite.TINY_SHAPE["context"], lm_suite.TINY["heldout_sequences"])
    for r in runs.values():
        cfg = r["config"]
        assert cfg["corpus_option"] == "web" and cfg["corpus"]["name"] == "web-like"
        assert cfg["corpus"]["clean_sha256"] == clean.sha256 != cfg["corpus"]["sha256"]
        assert cfg["corpus"]["heldout_sequences"] == clean.heldout.shape[0]
        assert cfg["corpus"]["train_sequences"] == sum(cfg["corpus"]["kind_counts"].values()) > clean.train.shape[0]
    sift = runs[("lm-sift-probabilistic", 0)]["results"]
    assert sift["steps"] == runs[("lm-full", 0)]["results"]["steps"] and sift["scoring_forward_samples"] > 0
    for arm, (scorer, _) in SCORERS.items():
        res = runs[(arm, 0)]["results"]
        assert (res["criterion"], res["scorer"], res["selection_mode"]) == (scorer.criterion, scorer.name, "topk")
        assert res["steps"] == sift["steps"] and res["kept_share"] < 0.6, arm  # the top half of each batch
        # the reference model's training and scoring, the scoring model's: timed in the arm
        assert res["parts_s"]["cpu"]["scoring"] > 0 and res["parts_s"]["wall"]["scoring"] > 0, arm
    assert runs[("lm-reference-filter", 0)]["results"]["scoring_forward_samples"] == 0  # no online forward
    assert runs[("lm-sift-excess", 0)]["results"]["scoring_forward_samples"] > 0
    rows = {(r["corpus"], r["arm"]) for r in map(json.loads, (tmp_path / "summary.jsonl").read_text().splitlines())}
    assert rows == {("web", a) for a in arms.split(",")}
    clean_records = [{**r, "config": {**r["config"], "corpus_option": "clean"}} for r in runs.values()]
    both = summarize_lm(list(runs.values()) + clean_records)
    assert sorted((r["corpus"], r["seeds"]) for r in both if r["arm"] == "lm-full") == [("clean", 1), ("web", 1)]


def test_the_command_lines_keep_the_two_kinds_of_arm_apart():
    with pytest.raises(SystemExit):
        suite.parse_args(["--arms", "full,lm-full"])
    with pytest.raises(SystemExit):
        lm_suite.parse_args(["--arms", "lm-full,epoch"])
    with pytest.raises(SystemExit):
        lm_suite.parse_args(["--arms", "lm-uniform"])  # no lm-full: no target
    with pytest.raises(SystemExit):
        lm_suite.parse_args(["--corpus", "crawl"])
    assert lm_suite.parse_args(["--corpus", "web"]).corpus == "web"
    args = lm_suite.parse_args([])
    assert args.corpus == "clean"
    assert {"lm-full", "lm-sift-probabilistic", "lm-uniform-b2", "lm-selective-backprop"} <= set(args.arms)
    assert len(args.seeds) == 3


def test_keep_count_is_keep_times_n_rounded_down_and_at_least_one():
    assert keep_count(0.5, 32) == 16
    assert keep_count(0.5, 7) == 3
    assert keep_count(1 / 3, 30) == 10
    assert keep_count(0.01, 10) == 1
    assert keep_count(1.0, 5) == 5
    for keep, n in ((0.0, 4), (1.5, 4), (0.5, 0)):
        with pytest.raises(ValueError):
            keep_count(keep, n)


@pytest.mark.parametrize("keep", [0.5, 1 / 3, 0.25])
def test_probabilities_are_proportional_to_the_loss_percentile_to_the_power(keep):
    losses = torch.tensor([0.3, 2.0, 0.1, 5.0, 1.0, 0.7])
    n = losses.numel()
    probs = selection_probabilities(losses, keep)
    rank = torch.argsort(torch.argsort(losses)).double()
    expected = ((rank + 0.5) / n) ** (1 / keep - 1)
    assert torch.allclose(probs, expected / expected.sum())
    assert probs.sum().item() == pytest.approx(1.0)
    assert torch.argmax(probs).item() == 3 and torch.argmin(probs).item() == 2
    assert torch.allclose(selection_probabilities(losses, 1.0), torch.full((n,), 1 / n, dtype=torch.float64))
    with pytest.raises(ValueError):
        selection_probabilities(torch.tensor([]), keep)


def test_select_draws_keep_n_distinct_rows_as_often_as_their_probability():
    losses = torch.tensor([0.2, 3.0, 1.0, 0.5])
    g = torch.Generator().manual_seed(0)
    rows = select(losses, 0.5, g)
    assert rows.tolist() == sorted(set(rows.tolist())) and len(rows) == 2
    probs = selection_probabilities(losses, 0.25)  # keep 1 of 4: each draw is one sample
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[select(losses, 0.25, g)] += 1
    assert torch.allclose(counts / 4000, probs.float(), atol=0.03)


def test_it_is_active_from_half_to_nine_tenths_on_every_other_batch():
    active = [s for s in range(20) if is_active(s, 20, 0.5, 0.9, 2)]
    assert active == [10, 12, 14, 16]
    assert [s for s in range(20) if is_active(s, 20, 0.5, 0.9, 0)] == list(range(10, 18))
    assert not any(is_active(s, 20, 0.0, 0.0, 0) for s in range(20))


def _fake_stdlib(root: Path, files: int) -> None:
    """``files`` modules, each one distinct byte repeated, plus folders the rule excludes."""
    for i in range(files):
        (root / f"pkg{i % 3}").mkdir(exist_ok=True)
        (root / f"pkg{i % 3}" / f"m{i:02d}.py").write_bytes(bytes([40 + i]) * (50 + 7 * i))
    for skipped in ("site-packages", "test", "idle_test"):
        (root / skipped).mkdir()
        (root / skipped / "x.py").write_bytes(b"~" * 500)
    (root / "notes.txt").write_bytes(b"~" * 500)


def test_the_corpus_is_deterministic_and_its_held_out_files_never_reach_training(tmp_path):
    _fake_stdlib(tmp_path, 2 * HELDOUT_EVERY)
    files = corpus_files(tmp_path)
    assert len(files) == 2 * HELDOUT_EVERY and all("~" not in p.read_text() for p in files)
    a, b = read_corpus(8, 4, tmp_path), read_corpus(8, 4, tmp_path)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()
    assert a.sha256 == b.sha256 == digest and a.describe()["sha256"] == digest
    assert torch.equal(a.train, b.train) and torch.equal(a.heldout, b.heldout)
    assert a.n_bytes == sum(p.stat().st_size for p in files) == a.train_bytes + a.heldout_bytes + a.reference_bytes
    heldout_bytes = {p.read_bytes()[0] for i, p in enumerate(files) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1}
    assert len(heldout_bytes) == 2
    assert set(a.heldout.unique().tolist()) <= heldout_bytes
    assert not set(a.train.unique().tolist()) & heldout_bytes
    assert a.train.shape[1] == a.heldout.shape[1] == 9 and a.heldout.shape[0] == 4
    files[0].write_bytes(b"changed")
    assert read_corpus(8, 4, tmp_path).sha256 != digest


def test_the_corpus_refuses_what_it_cannot_split(tmp_path):
    _fake_stdlib(tmp_path, HELDOUT_EVERY - 1)
    with pytest.raises(ValueError, match="at least"):
        read_corpus(8, 4, tmp_path)
    with pytest.raises(ValueError):
        read_corpus(1, 4, tmp_path)
    with pytest.raises(FileNotFoundError):
        corpus_files(tmp_path / "missing")


def test_each_seed_streams_its_own_order_and_every_arm_of_a_seed_the_same():
    assert torch.equal(stream_order(100, 3), stream_order(100, 3))
    assert not torch.equal(stream_order(100, 3), stream_order(100, 4))
    assert sorted(stream_order(100, 3).tolist()) == list(range(100))
