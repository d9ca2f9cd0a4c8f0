"""The compiled backends (``--backend compiled`` / ``cuda-compiled``, ``core/compiled.py``):
each arm's model under ``torch.compile``, warmed up before its clock, the run otherwise the
eager run. Tested on the CPU with Dynamo's ``eager`` compiler (the graphs and guards of a
compiled run without generating code: the same computation as eager, so the same run), and
once with inductor, the compiler a user gets."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.core import runner
from benchmarks.core.compiled import graphs_compiled
from benchmarks.instruments.environment import setup_backend
from benchmarks.tasks import registry
from tests.helpers.subprocess_limits import LIMIT_S

REPO = Path(__file__).resolve().parents[2]


def test_the_compiled_backends_name_their_compiler_and_the_others_refuse_one():
    cpu = setup_backend("compiled")
    assert cpu["compile"] and cpu["compile_backend"] == "inductor" and cpu["device"] == torch.device("cpu")
    assert setup_backend("compiled", "eager")["compile_backend"] == "eager"
    assert not setup_backend("eager").get("compile")
    with pytest.raises(ValueError, match="needs --backend compiled"):
        setup_backend("eager", "eager")
    with pytest.raises(ValueError, match="unknown backend"):
        setup_backend("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            setup_backend("cuda-compiled")
    else:
        assert setup_backend("cuda-compiled")["device"].type == "cuda"


def test_an_arms_model_is_compiled_and_warmed_before_its_clock_with_its_weights_untouched():
    task = registry.TASKS["digits"]
    data = registry.make_data(task, cache=None)
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in registry.make_model(task).state_dict().items()}
    opts = type("Opts", (), {"progress": False, "beta": 1.0, "evals_per_epoch": 2})()
    before = graphs_compiled()
    ctx = runner.arm_context("full", task, data, 0, init, opts, setup_backend("compiled", "eager"))
    assert isinstance(ctx.model, torch._dynamo.eval_frame.OptimizedModule)
    assert graphs_compiled() > before  # compiled in the warm-up, before the clock started
    assert ctx.clock.total == 0
    state = ctx.model._orig_mod.state_dict()
    assert all(torch.equal(state[k], init[k]) for k in init)  # no optimizer step, no weight moved
    assert all(p.grad is None for p in ctx.model.parameters())  # the warm-up's gradients dropped
    # the graphs a run calls are all compiled: a short last batch (training, scoring in train
    # and eval mode) compiles nothing more once the clock runs
    warm = graphs_compiled()
    short = data.x_train[: task.batch_size - 3], data.y_train[: task.batch_size - 3]
    torch.nn.functional.cross_entropy(ctx.model(short[0]), short[1]).backward()
    with torch.no_grad():
        ctx.model(short[0])
        ctx.model.eval()
        ctx.model(short[0])
        ctx.model.train()
    assert graphs_compiled() == warm
    eager = runner.arm_context("full", task, data, 0, init, opts, setup_backend("eager"))
    assert not isinstance(eager.model, torch._dynamo.eval_frame.OptimizedModule)


def test_a_language_model_arms_model_is_compiled_and_warmed_before_its_clock():
    from benchmarks.core.lm_context import LMConfig
    from benchmarks.core.lm_runner import make_lm_context
    from benchmarks.lm_suite import TINY, TINY_SHAPE
    from benchmarks.tasks.lm_corpus import read_corpus
    from benchmarks.tasks.lm_model import ByteTransformer, LMShape

    config = LMConfig(shape=LMShape(**TINY_SHAPE), **TINY)
    corpus = read_corpus(config.shape.context, heldout_sequences=config.heldout_sequences)
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in ByteTransformer(config.shape).state_dict().items()}
    before = graphs_compiled()
    ctx = make_lm_context(config, corpus, 0, init, setup_backend("compiled", "eager"), progress=False)
    assert isinstance(ctx.model, torch._dynamo.eval_frame.OptimizedModule)
    assert graphs_compiled() > before and ctx.clock.total == 0
    state = ctx.model._orig_mod.state_dict()
    assert all(torch.equal(state[k], init[k]) for k in init)
    assert all(p.grad is None for p in ctx.model.parameters())


def _suite(out: Path, *backend: str) -> dict[str, dict]:
    arm_names = "full,sift-probabilistic,epoch,infobatch"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "suite.py"), "--task", "digits", "--tiny", "--seeds", "0"]
        + ["--arms", arm_names, "--out", str(out), "--no-progress", *backend],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["arm"]: r for r in map(json.loads, (out / "runs.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_a_compiled_suite_run_is_the_eager_run_and_compiles_nothing_while_its_clock_runs(tmp_path):
    eager = _suite(tmp_path / "eager")
    compiled = _suite(tmp_path / "compiled", "--backend", "compiled", "--compile-backend", "eager")
    assert set(compiled) == set(eager)
    for arm, record in compiled.items():
        res, ref = record["results"], eager[arm]["results"]
        assert record["backend"] == "compiled" and record["versions"]["compile_backend"] == "eager"
        assert res["graphs_compiled_in_run"] == 0, arm  # every shape was compiled in the warm-up
        for key in ("steps", "samples_kept", "scoring_forward_samples", "final_test_acc"):
            assert res[key] == ref[key], (arm, key)
        assert [c["test_acc"] for c in res["curve"]] == [c["test_acc"] for c in ref["curve"]], arm
    assert "graphs_compiled_in_run" not in eager["full"]["results"]


@pytest.mark.slow
def test_a_compiled_language_model_run_compiles_nothing_while_its_clock_runs(tmp_path):
    """With the compiler users get (inductor, the default), generating code on every leg."""
    arm_names = ["lm-full", "lm-sift-probabilistic", "lm-selective-backprop"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lm_suite.py"), "--tiny", "--seeds", "0"]
        + ["--arms", ",".join(arm_names), "--out", str(tmp_path), "--no-progress", "--backend", "compiled"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["arm"] for r in records] == arm_names
    for r in records:
        assert r["backend"] == "compiled" and r["versions"]["compile_backend"] == "inductor"
        assert r["results"]["graphs_compiled_in_run"] == 0, r["arm"]


def test_compile_backend_is_refused_without_a_compiled_backend():
    from benchmarks import lm_suite, suite

    for parse in (suite.parse_args, lm_suite.parse_args):
        with pytest.raises(SystemExit):
            parse(["--compile-backend", "eager"])
        assert parse(["--backend", "cuda-compiled", "--compile-backend", "eager"]).compile_backend == "eager"
