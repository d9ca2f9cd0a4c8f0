"""The backend interface the engine and loader rely on: the only place that asks what a device is."""

import abc
import contextlib
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from neuron_sift.backends.pending import PendingStore


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer; the CPU for a module with
    neither): the device a backend is chosen for."""
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


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
        self, key: Hashable, fn: Callable[..., tuple[torch.Tensor, ...]], inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, ...]:
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

    def inference_mode(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.inference_mode`` for the scoring forward (``scoring_inference_mode``)."""
        return torch.inference_mode()

    def autocast(self, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
        """Autocast to ``dtype`` on this backend's device (the scoring forward's lower
        precision); ``ValueError`` where the device's autocast does not take it."""
        kind = self.device.type
        if not torch.amp.is_autocast_available(kind):
            raise ValueError(f"scoring_precision: torch.autocast is not available on {kind} devices")
        return torch.autocast(device_type=kind, dtype=dtype)

    def sync(self) -> None:  # noqa: B027 - a no-op where the device has no lazy graph
        """The step boundary: cut the device's lazy graph (asynchronously) where it has one."""

    def wait(self) -> None:  # noqa: B027 - a no-op where device work is done when issued
        """Block until the device has finished the work issued so far: only for timing the
        work itself (the payback check), never in the path of a batch."""

    @property
    def fixed_shapes(self) -> bool:
        """Whether every graph must see one input shape (a short last batch padded to the
        batch size): a device that compiles a graph per shape."""
        return False

    @property
    def extraction_only(self) -> bool:
        """Whether device values are stubs (graph extraction for Neuron): never trust a read."""
        return False

    @property
    def can_run_step_on_host(self) -> bool:
        """Whether this device is the host, where the engine's host step can run (it also
        needs the C kernels, which the engine checks)."""
        return False

    @property
    def runs_step_on_host(self) -> bool:
        """Whether the selection step should run on the host where it can: the engine runs
        it there when this is true and the C kernels were built."""
        return False

    @property
    def holds_on_host(self) -> bool:
        """Whether state kept for this device (the epoch loader's score tables) lives in host
        memory as plain arrays: true for the CPU, where a device tensor would only add copies."""
        return self.device.type == "cpu"

    @property
    def sort_method(self) -> str:
        """How the kernels rank among sorted values here: ``"search"`` (``searchsorted``) or
        ``"merge"`` (sort-merge of static-shape ops, for compilers without ``searchsorted``)."""
        return "search"

    def same_device(self, a: torch.device, b: torch.device) -> bool:
        """Whether tensors on ``a`` and ``b`` can meet in one op: equal devices, or the same
        type where either index is unspecified (``cuda`` and ``cuda:0``)."""
        a, b = torch.device(a), torch.device(b)
        return a == b or (a.type == b.type and None in (a.index, b.index))

    def compile_count(self) -> int | None:
        """Graph compilations so far in this process, where the device compiles graphs (else None)."""
        return None

    def pending_store(
        self, batch_size: int, rows_per_add: int, limit: int | None, default_batch: bool
    ) -> "PendingStore":
        """Where kept samples are pending until a full batch: on the host here
        (``backends/pending.py``).

        ``rows_per_add``: rows a source batch offers at most; ``limit``: the bound on pending
        samples under data-parallel agreement (None: none); ``default_batch``: whether the
        batches are the default handling's (whose tensor fields a device store can hold).
        """
        from neuron_sift.backends.pending import HostPending

        return HostPending(batch_size)
