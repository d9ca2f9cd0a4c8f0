"""Epoch-level sifting under torchrun + gloo: one plan for all ranks, equal batches, one
collective per epoch, merged scores, synchronised parameters, per-rank exact resume."""

import json
import os
import socket
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "epoch_ddp_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
TIMEOUT_S = 240
EPOCHS = 5  # warm-up, 3 sifted, 1 annealing (anneal_fraction 0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, world, *args, tag="run"):
    out = tmp_path / tag
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", WORKER, "--out", str(out), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"distributed run hung for {TIMEOUT_S} s")
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def results(out, world, resumed=False):
    suffix = "_resumed" if resumed else ""
    return [json.loads((out / f"rank{r}{suffix}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("budget", [None, 0.4])
def test_one_plan_equal_batches_one_collective_per_epoch(tmp_path, world, budget):
    args = ["--epochs", str(EPOCHS)] + (["--budget", str(budget)] if budget else [])
    runs = results(launch(tmp_path, world, *args), world)
    steps = [r["steps"] for r in runs]
    assert all(s == steps[0] for s in steps), steps
    assert all(r["plans"] == runs[0]["plans"] for r in runs)  # the same global plan every epoch
    assert all(r["params"] == runs[0]["params"] for r in runs)  # DDP kept them identical
    assert all(r["merged"] == runs[0]["merged"] for r in runs)  # the same merged scores
    # every rank trained a disjoint share of each epoch's plan
    start = 0
    for e, n in enumerate(steps[0]):
        per_rank = [set(i for b in r["ids"][start : start + n] for i in b) for r in runs]
        union = set().union(*per_rank)
        assert sum(len(s) for s in per_rank) == len(union)
        if budget and 0 < e < EPOCHS - 1:
            assert len(union) == runs[0]["kept"][e] == (round(budget * 1003) // world) * world
        start += n
    # one all-reduce per epoch that plans from scores (epochs 1..3), none per step
    assert all(r["all_reduce"] == 3 for r in runs), [r["all_reduce"] for r in runs]
    merged = runs[0]["merged"]
    assert sum(1 for v in merged if v >= 0) >= 1003 - world  # the warm-up scored (almost) every sample on some rank


@pytest.mark.slow
def test_each_rank_resumes_its_own_state(tmp_path):
    common = ["--epochs", str(EPOCHS), "--oracle"]
    full = results(launch(tmp_path, 2, *common, "--save-after", "40", tag="full"), 2)
    resumed = results(launch(tmp_path, 2, *common, "--load", tag="full"), 2, resumed=True)
    for r in range(2):
        assert resumed[r]["ids"] == full[r]["ids"][40:]
        assert resumed[r]["plans"][1:] == full[r]["plans"][-(len(resumed[r]["plans"]) - 1):]
