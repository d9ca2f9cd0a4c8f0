"""The backend interface the engine and loader rely on."""

import abc
from typing import Callable, Hashable, Tuple

import torch


class Backend(abc.ABC):
    """Device placement, host reads, how the selection step runs, and step boundaries for one device."""

    name: str = "base"

    def __init__(self, device: torch.device):
        self.device = device

    def upload(self, values, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D device tensor of host values: graph data, never graph constants.

        Per-batch numbers (valid rows, rows to take) are uploaded together as one vector
        and indexed on the device. Not as 0-dim tensors: torch-xla caches 0-dim device data
        by value, so two scalars that happen to be equal would become one graph input and
        the graph would compile anew.
        """
        return torch.tensor(list(values), dtype=dtype, device=self.device)

    def run_step(
        self, key: Hashable, fn: Callable[..., Tuple[torch.Tensor, ...]], inputs: Tuple[torch.Tensor, ...]
    ) -> Tuple[torch.Tensor, ...]:
        """``fn(*inputs)``: the engine's step, a pure function of tensors (``engine.step.flat_step``).

        ``key`` names everything static about ``fn`` (mode, k, ...); with the input shapes
        it identifies one graph, for backends that build the step's graph once and reuse it.
        The default runs the step op by op.
        """
        return fn(*inputs)

    @property
    def compiles_step(self) -> bool:
        """Whether ``run_step`` runs the torch step as a compiled graph (then it runs on the CPU too)."""
        return False

    @abc.abstractmethod
    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Read ``tensor`` back to the CPU (the one host read per source batch, where any)."""

    def after_step(self) -> None:
        """Called after each source batch's sifting math has been issued."""

    @property
    def extraction_only(self) -> bool:
        """Whether device values are stubs (graph extraction for Neuron): never trust a read."""
        return False

    @property
    def gathers_on_device(self) -> bool:
        """Whether fixed-mode selections are gathered on the device without a host read."""
        return False

    # -- device questions of epoch-level sifting (neuron_sift/epoch/) ---------------------
    # Added so that epoch/ never tests a device type itself; additions only.

    @property
    def holds_on_host(self) -> bool:
        """Whether state kept for this device (the epoch loader's score tables) lives in host
        memory as plain arrays: true for the CPU, where a device tensor would only add copies."""
        return self.device.type == "cpu"

    @property
    def sort_method(self) -> str:
        """How rank kernels find ranks on this device (``percentile_of_all``'s ``method``):
        ``"search"`` (``searchsorted``) wherever it has a lowering."""
        return "search"

    def same_device(self, a: torch.device, b: torch.device) -> bool:
        """Whether tensors on ``a`` and ``b`` can meet in one op: equal devices, or the same
        type where either index is unspecified (``cuda`` and ``cuda:0``)."""
        a, b = torch.device(a), torch.device(b)
        return a == b or (a.type == b.type and None in (a.index, b.index))
