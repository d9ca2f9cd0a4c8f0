"""torch-xla backend: Trainium (torch-neuronx provides the Neuron PJRT device) or XLA's CPU.

Only imported when the model is on an XLA device. Uses the current torch-xla API
(``torch_xla.sync``, ``torch_xla.runtime``), never the deprecated ``xm.mark_step`` /
``xm.xla_device``.

What it guarantees, with the default batch handling (see README, measured in tests):
- the selection step is traced once per shape and inserted as one node into each source
  batch's graph (``xla_pure.py``; traced per call where torch-xla lacks the function);
- the scoring forward and the selection math are traced into a fixed set of graphs
  (short last batches are padded to the batch size, scalars that change per batch are
  device data, not graph constants), so compilation stops after warm-up;
- ``sync()`` after each source batch cuts the lazy graph (asynchronously, no host wait),
  so many source batches without an emitted batch never build one huge graph;
- fixed mode reads nothing back; probabilistic mode reads two int64 scalars per source
  batch (the kept count and the non-finite count).

Under ``neuron_parallel_compile`` (``NEURON_EXTRACT_GRAPHS_ONLY`` set) graphs run as stubs
that return zeros, so values read back mean nothing. The backend then never trusts a
read: probabilistic mode assumes the expected kept count, so batches are still emitted
and the training graphs are still extracted.
"""

import contextlib
import os
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch_xla
import torch_xla.runtime as xr

from neuron_sift.backends.base import Backend
from neuron_sift.backends.device_pending import DevicePending
from neuron_sift.backends.pending import HostPending, PendingStore
from neuron_sift.backends.xla_pure import PureStepCache


def graph_extraction_only() -> bool:
    """True under ``neuron_parallel_compile``: device values are zeros, not results."""
    return os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY", "") not in ("", "0")


class XlaBackend(Backend):
    name = "xla"

    def __init__(self, device: torch.device, trace_once: bool = True):
        super().__init__(device)
        self.device_type = xr.device_type()  # 'CPU', 'NEURON', 'TPU', ...
        # False: trace the step op by op on every call (benchmarks/machinery.py's "before").
        self.trace_once = trace_once
        self.pure_steps = PureStepCache()

    def run_step(self, key: Hashable, fn: Callable, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if self.trace_once:
            out = self.pure_steps.run(key, fn, inputs)
            if out is not None:
                return out
        return fn(*inputs)

    def inference_mode(self) -> contextlib.AbstractContextManager[Any]:
        """Refused: torch-xla's lazy tensors cannot be inference tensors ("Cannot set
        version_counter for inference tensor" at the first op)."""
        raise ValueError(
            "scoring_inference_mode=True is not supported on torch-xla devices (its lazy tensors cannot be "
            "inference tensors); leave it False: the scoring forward runs under torch.no_grad there"
        )

    @property
    def fixed_shapes(self) -> bool:
        return True

    @property
    def extraction_only(self) -> bool:
        return graph_extraction_only()

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().cpu()

    def sync(self) -> None:
        torch_xla.sync()

    def wait(self) -> None:
        """Cut the lazy graph and wait for the device to run it."""
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()

    @property
    def holds_on_host(self) -> bool:
        """False, also on torch-xla's CPU backend: its tensors are lazy device data."""
        return False

    @property
    def sort_method(self) -> str:
        return "merge"  # torch-xla has no lowering for searchsorted (it falls back to the CPU)

    def compile_count(self) -> int | None:
        return xla_compile_count()

    def pending_store(self, batch_size: int, rows_per_add: int, limit: int | None, default_batch: bool) -> PendingStore:
        """The default batch's tensor fields are pending on the device, in buffers of static shape;
        a batch type of the user's own is pending on the host (one read of the kept indices)."""
        if not default_batch:
            return HostPending(batch_size)
        return DevicePending(batch_size, self, rows_per_add, limit)


def xla_compile_count() -> int:
    """Compilations so far in this process (``CompileTime`` samples of torch_xla's metrics)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return 0 if data is None else int(data[0])
