"""Shared by the data-parallel tests: launch a worker under torchrun (gloo, CPU), read its
per-rank results, and end a worker's process group cleanly."""

import gc
import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
WORKER = os.path.join(os.path.dirname(__file__), "ddp_worker.py")  # both modes' DDP worker
TIMEOUT_S = 240  # a hang fails the test instead of blocking CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(worker, tmp_path, world, *args, tag="run"):
    """Run ``worker`` on ``world`` local ranks; returns the folder its ranks wrote to."""
    out = tmp_path / tag
    out.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={world}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        worker,
        "--out",
        str(out),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, PYTHONFAULTHANDLER="1")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"distributed run hung for {TIMEOUT_S} s: {' '.join(args)}")
    assert done.returncode == 0, done.stderr[-4000:]
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
