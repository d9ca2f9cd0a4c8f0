"""Device backends: where the sifting math runs and how results reach the host.

``eager`` runs the torch step on any device PyTorch itself drives: CPU (there the step
runs on the host, C kernels), CUDA, and every other device type that is not ``xla``
(``neuron`` from TorchNeuron, ``xpu``, ``mps``, a PrivateUse1 device); ``compiled`` is
``eager`` with the step as one ``torch.compile(fullgraph=True, dynamic=False)`` graph.
``xla`` runs on torch-xla devices (Trainium through torch-neuronx 2.9, or torch-xla's CPU
backend); torch_xla is imported only when that backend is chosen. The backend follows
the model's device unless named; a ``Backend`` instance may be passed instead of a name
(for example ``EagerBackend(device, compile_step=True, compile_backend=...)``).
"""

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.backends.eager import EagerBackend

BACKEND_NAMES = ("eager", "compiled", "xla")


def resolve_backend(device: torch.device, name: str | Backend | None = None) -> Backend:
    """The backend for ``device``: ``xla`` for XLA devices, else ``eager``; or the one named or given."""
    if isinstance(name, Backend):
        if name.device.type != device.type or (
            name.device.index is not None and device.index is not None and name.device.index != device.index
        ):
            raise ValueError(f"the backend given runs on {name.device}, but the model is on {device}")
        return name
    if name is not None and name not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, a neuron_sift Backend, or None, got {name!r}")
    if name is None:
        name = "xla" if device.type == "xla" else "eager"
    if name == "xla":
        if device.type != "xla":
            raise ValueError(f"backend='xla' needs the model on an XLA device, but it is on {device}")
        from neuron_sift.backends.xla import XlaBackend  # imports torch_xla

        return XlaBackend(device)
    if device.type == "xla":
        raise ValueError(f"backend={name!r} cannot run on an XLA device; use backend='xla' or None")
    return EagerBackend(device, compile_step=name == "compiled")


def fused_optimizers_refuse_xla(device: object) -> list[str] | None:
    """torch's device types for fused optimizer kernels (``fused=True``), where ``device`` is an
    XLA device they leave out; None where it is not one, or they take it, or torch does not
    say. Why: transformers' fused AdamW default fails at the first step there
    (``integrations/hf_trainer/optimizer.py`` refuses it at the call)."""
    if not isinstance(device, torch.device) or device.type != "xla":
        return None
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return None
    supported = list(_get_fused_kernels_supported_devices())
    return None if "xla" in supported else supported


__all__ = ["BACKEND_NAMES", "Backend", "EagerBackend", "fused_optimizers_refuse_xla", "resolve_backend"]
