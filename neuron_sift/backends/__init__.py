"""Device backends: where the sifting math runs and how results reach the host.

``eager`` runs plain PyTorch on CPU or CUDA. ``xla`` runs on torch-xla devices
(Trainium through torch-neuronx, or torch-xla's CPU backend); torch_xla is imported only
when that backend is chosen. The backend follows the model's device unless named.
"""

from typing import Optional

import torch

from neuron_sift.backends.base import Backend
from neuron_sift.backends.eager import EagerBackend

BACKEND_NAMES = ("eager", "xla")


def resolve_backend(device: torch.device, name: Optional[str] = None) -> Backend:
    """The backend for ``device``: ``xla`` for XLA devices, else ``eager``; or the one named."""
    if name is not None and name not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES} or None, got {name!r}")
    if name is None:
        name = "xla" if device.type == "xla" else "eager"
    if name == "xla":
        if device.type != "xla":
            raise ValueError(f"backend='xla' needs the model on an XLA device, but it is on {device}")
        from neuron_sift.backends.xla import XlaBackend  # imports torch_xla

        return XlaBackend(device)
    if device.type == "xla":
        raise ValueError("backend='eager' cannot run on an XLA device; use backend='xla' or None")
    return EagerBackend(device)


__all__ = ["BACKEND_NAMES", "Backend", "EagerBackend", "resolve_backend"]
