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
from benchmarks.instruments.options import BACKEND_CHOICES

# The backends a run can train on (``--backend``): the host's CPU eager or under torch.compile,
# one GPU eager or under torch.compile, torch-xla (its CPU device here, Trainium's NEURON there).
BACKENDS = BACKEND_CHOICES


def setup_backend(name: str, compile_backend: str | None = None) -> dict[str, Any]:
    """``eager`` / ``compiled`` (the CPU, the model under ``torch.compile`` in the latter),
    ``cuda`` / ``cuda-compiled`` (one GPU, likewise) or ``xla`` (torch-xla; ``PJRT_DEVICE=CPU``
    unless set; ``PJRT_DEVICE=NEURON`` on Trainium): the device, its description, on a GPU the
    ``wait`` its clock reads after, and on XLA the ``sync`` (cut the graph) and ``wait`` calls
    the runner's clock and context use. On the compiled backends ``compile`` is set and
    ``compile_backend`` names torch.compile's compiler (``compile_backend``; default inductor):
    the runners compile each arm's model with it (``core/compiled.py``)."""
    compiles = name in ("compiled", "cuda-compiled")
    if compile_backend is not None and not compiles:
        raise ValueError(f"a compile backend ({compile_backend!r}) needs --backend compiled or cuda-compiled")
    found: dict[str, Any]
    if name in ("eager", "compiled"):
        found = {
            "name": name,
            "device": torch.device("cpu"),
            "device_desc": f"cpu ({platform.processor() or platform.machine()})",
        }
    elif name in ("cuda", "cuda-compiled"):  # one GPU; wall-clock read after torch.cuda.synchronize()
        if not torch.cuda.is_available():
            raise RuntimeError(f"--backend {name}: torch sees no CUDA device")
        found = {
            "name": name,
            "device": torch.device("cuda", 0),
            "device_desc": f"cuda:0 ({torch.cuda.get_device_name(0)})",
            "wait": torch.cuda.synchronize,
        }
    else:
        return _xla_backend(name)
    if compiles:
        found.update(compile=True, compile_backend=compile_backend or "inductor")
    return found


def _xla_backend(name: str) -> dict[str, Any]:
    if name != "xla":
        raise ValueError(f"unknown backend {name!r}: one of {', '.join(BACKENDS)}")
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
    if backend.get("compile"):
        v["compile_backend"] = backend["compile_backend"]
    return v
