"""The backend a run trains on and what its records say about the environment: versions,
thread count, the commit (``versions``)."""

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

import neuron_sift


def setup_backend(name: str) -> dict[str, Any]:
    """``eager`` (the CPU), ``cuda`` / ``cuda-compiled`` (one GPU, eager or under ``torch.compile``:
    the single-pass LM task's runner compiles) or ``xla`` (torch-xla; ``PJRT_DEVICE=CPU`` unless
    set; ``PJRT_DEVICE=NEURON`` on Trainium): the device,
    its description, and on XLA the ``sync`` (cut the graph) and ``wait`` (for the device)
    calls the runner's clock and context use."""
    if name == "eager":
        return {
            "name": "eager",
            "device": torch.device("cpu"),
            "device_desc": f"cpu ({platform.processor() or platform.machine()})",
        }
    if name in ("cuda", "cuda-compiled"):  # one GPU; wall-clock read after torch.cuda.synchronize()
        if not torch.cuda.is_available():
            raise RuntimeError(f"--backend {name}: torch sees no CUDA device")
        return {
            "name": name,
            "device": torch.device("cuda", 0),
            "device_desc": f"cuda:0 ({torch.cuda.get_device_name(0)})",
            "wait": torch.cuda.synchronize,
            "compile": name == "cuda-compiled",  # the task's runner wraps the model in torch.compile
        }
    if name != "xla":
        raise ValueError(f"unknown backend {name!r}: eager, cuda, cuda-compiled or xla")
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    device = torch_xla.device()  # before the first backward of the process (see README)
    return {
        "name": "xla",
        "device": device,
        "device_desc": f"xla:{xr.device_type()}",
        "sync": torch_xla.sync,
        "wait": xm.wait_device_ops,
        "torch_xla": torch_xla.__version__,
    }


def git_commit() -> str | None:
    """HEAD's hash, '+dirty' when benchmarks/ or neuron_sift/ differ from it; None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "benchmarks", "neuron_sift"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions(backend: dict[str, Any]) -> dict[str, Any]:
    v = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "neuron_sift": neuron_sift.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "commit": git_commit(),
    }
    if "torch_xla" in backend:
        v["torch_xla"] = backend["torch_xla"]
    return v
