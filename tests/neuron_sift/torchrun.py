"""Shared by the data-parallel tests: launch a worker under torchrun (gloo, CPU), read its
per-rank results, and end a worker's process group cleanly."""

import gc
import json
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers.subprocess_limits import LIMIT_S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
WORKER = os.path.join(os.path.dirname(__file__), "ddp_worker.py")  # both modes' DDP worker
TIMEOUT_S = LIMIT_S  # a hang fails the test instead of blocking CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(worker, tmp_path, world, *args, tag="run", restarts=0, finishes=True):
    """Run ``worker`` on ``world`` local ranks; returns the folder its ranks wrote to.

    ``restarts``: torchrun's ``--max-restarts``; with restarts the c10d rendezvous gets a store
    per attempt (a store shared across restarts hands the new ranks the dead ones' addresses,
    pytorch/pytorch#135712 and #167288, so the restarted group can fail to connect).
    ``finishes``: whether the run is expected to exit 0 (False: a run left to fail)."""
    out = tmp_path / tag
    out.mkdir(exist_ok=True)
    if restarts:
        rendezvous = [f"--max-restarts={restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    else:
        rendezvous = ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={world}",
        "--nnodes=1",
        *rendezvous,
        worker,
        "--out",
        str(out),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, PYTHONFAULTHANDLER="1")
    if restarts:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"distributed run hung for {TIMEOUT_S} s: {' '.join(args)}")
    assert (done.returncode == 0) == finishes, done.stderr[-4000:]
    return out


def results(out, world, resumed=False):
    suffix = "_resumed" if resumed else ""
    return [json.loads((out / f"rank{r}{suffix}.json").read_text()) for r in range(world)]


def release_process_group() -> None:
    """Destroy the process group once nothing holds it, so gloo's threads are joined now.

    Call it after deleting the DistributedDataParallel model: DDP (and its C++ reducer) keep
    a reference to the process group, so ``destroy_process_group()`` alone leaves the gloo
    group alive until interpreter exit, where destroying it can abort the process
    ("terminate called without an active exception", SIGABRT, after all work is done; seen
    with torch 2.15 under load). A torch defect: pytorch/pytorch#109478 (a process group is
    not destroyed at exit); pytorch/pytorch PR 179291 describes the abort at interpreter
    finalization.
    """
    import torch.distributed as dist

    gc.collect()  # DDP's hooks form reference cycles: collect them while torch is alive
    dist.destroy_process_group()
