"""PyTorch's own devices (CPU, CUDA, and any other: ``neuron``, ``xpu``, ``mps``, a
PrivateUse1 device): the torch step runs there op by op, or as one compiled graph.

Why a compiled option: on TorchNeuron (Trainium's native PyTorch) every eager op is a
device launch, and ``torch.compile(backend="neuron", fullgraph=True)`` with static shapes
is its route to one device program. The step's shapes depend only on (B, H, k) and the
short last batch is padded, so ``dynamic=False`` compiles one graph per mode and batch
size and never again; ``fullgraph=True`` makes any graph break an error instead of a
silent split. Reads are ordinary ``.cpu()``.
"""

from collections.abc import Callable, Hashable
from typing import Any

import torch

from neuron_sift.backends.base import Backend

# The compiler backend a device type usually uses with torch.compile (TorchNeuron
# registers "neuron"); every other device type uses torch's default, inductor.
DEFAULT_COMPILE_BACKENDS = {"neuron": "neuron"}


def default_compile_backend(device: torch.device) -> str:
    return DEFAULT_COMPILE_BACKENDS.get(device.type, "inductor")


class EagerBackend(Backend):
    """The torch step on ``device``; with ``compile_step=True`` as one ``torch.compile`` graph.

    ``compile_backend``: the name or callable passed to ``torch.compile`` (None: the
    device's usual one, ``default_compile_backend``).
    """

    name = "eager"

    def __init__(self, device: torch.device, compile_step: bool = False, compile_backend: Any | None = None):
        super().__init__(torch.device(device))
        if self.device.type == "xla":
            raise ValueError("backend='eager' cannot run on an XLA device; use backend='xla' or None")
        if compile_backend is not None and not compile_step:
            raise ValueError("compile_backend is only used with compile_step=True")
        self._compile = bool(compile_step)
        self.compile_backend = compile_backend if compile_backend is not None else default_compile_backend(self.device)
        self._compiled: dict[Hashable, Callable] = {}

    @property
    def compiles_step(self) -> bool:
        return self._compile

    def run_step(self, key: Hashable, fn: Callable, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if not self._compile:
            return fn(*inputs)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = torch.compile(
                fn, fullgraph=True, dynamic=False, backend=self.compile_backend
            )
        return compiled(*inputs)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().cpu()

    def wait(self) -> None:
        """The device's own synchronize, where it has one (CUDA and the accelerators torch
        drives); the CPU's work is done when issued."""
        module = getattr(torch, self.device.type, None)
        if self.device.type != "cpu" and module is not None and hasattr(module, "synchronize"):
            module.synchronize(self.device)

    @property
    def can_run_step_on_host(self) -> bool:
        """A CPU device is the host."""
        return self.device.type == "cpu"

    @property
    def runs_step_on_host(self) -> bool:
        """On the CPU the C-kernel host step runs, unless the torch step is compiled (or the
        extension was not built: then the engine runs the torch step on the CPU, with the
        same selections)."""
        return self.can_run_step_on_host and not self._compile
