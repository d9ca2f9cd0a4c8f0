"""Opt-in, torch-xla: the user's scoring forward traced once per shape (``TracedLoss``)."""

from typing import Any

import torch

from neuron_sift.backends.base import model_device
from neuron_sift.exceptions import LossOutputException


class TracedLoss:
    """Opt-in, torch-xla: the scoring forward traced once per shape instead of per source batch.

    Why: torch-xla traces the user's model anew for every source batch's scoring forward;
    for a large model that tracing is the host's main cost per source batch. Wrap the loss,
    ``loss_impl=TracedLoss(MyLoss())``: the loss runs as a pure function of the model's
    parameters and buffers (through ``torch.func.functional_call``, so updated weights are
    inputs, never constants captured at trace time) and of the batch's tensors, built once
    per shape with torch-xla's ``assume_pure_torch`` and inserted as one node afterwards.

    The loss gets ``original_batch`` (the batch as your DataLoader gave it, on the device)
    and ``transformed_batch=None``. It must be traceable that way: no host reads (``.item()``,
    ``.tolist()``, printing) and no Python control flow on tensor values; such a loss is
    refused on its first call with the reason (found by running it once lazily). The model's mode (eval while scoring) is part
    of the trace, as are any tensors the loss creates (constants).
    """

    def __init__(self, loss_impl: Any):
        from neuron_sift.loss.abstract_sift_loss_module import resolve_loss_fn

        self.loss_impl = loss_impl
        self._loss_fn = resolve_loss_fn(loss_impl)
        self._pure: dict = {}

    def loss(self, model: torch.nn.Module, transformed_batch: Any, original_batch: Any = None) -> torch.Tensor:
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten(original_batch)
        if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
            raise LossOutputException(
                "TracedLoss needs a batch of tensors only (non-tensor fields cannot be inputs of a traced "
                f"function); got leaves of types {sorted({type(t).__name__ for t in leaves})}; use the loss unwrapped"
            )
        if model_device(model).type != "xla" or any(t.device.type != "xla" for t in leaves):
            raise LossOutputException(
                "TracedLoss traces with torch-xla and needs the model and the batch on an XLA device; "
                "use the loss unwrapped elsewhere"
            )
        named = list(model.named_parameters()) + list(model.named_buffers())
        names = tuple(n for n, _ in named)
        tensors = tuple(t for _, t in named) + tuple(leaves)
        signature = (id(model), model.training, names, spec, tuple((tuple(t.shape), t.dtype) for t in tensors))
        pure = self._pure.get(signature)
        if pure is None:
            self._check_traceable(model, original_batch)
            pure = self._pure[signature] = self._trace(model, names, spec, len(names))
        with torch.no_grad():
            return pure(*tensors)[0]

    def _check_traceable(self, model: torch.nn.Module, batch: Any) -> None:
        """Run the loss once, lazily, and refuse it if it read anything back to the host.

        On torch-xla's placeholder tensors a host read does not raise, it crashes the
        process; a read during an ordinary lazy call shows in torch-xla's counters
        (``aten::_local_scalar_dense`` for ``.item()`` and ``if tensor:``, transfers for
        ``.tolist()`` and printing). The graph of this call is dropped unexecuted.
        """
        import torch_xla.debug.metrics as met

        def reads() -> int:
            data = met.metric_data("TransferFromDeviceTime")
            return (met.counter_value("aten::_local_scalar_dense") or 0) + (data[0] if data else 0)

        before = reads()
        self._loss_fn(model, None, batch)
        if reads() != before:
            raise LossOutputException(
                f"TracedLoss: {type(self.loss_impl).__name__}.loss cannot be traced as a pure function of the "
                "parameters, buffers and batch tensors: it reads values back to the host (.item(), .tolist(), "
                "printing, or Python control flow on a tensor value such as `if loss.mean() > 0`); use the loss "
                "unwrapped"
            )

    def _trace(self, model: torch.nn.Module, names: tuple, spec: Any, n_state: int):
        from torch.utils._pytree import tree_unflatten

        from neuron_sift.backends.xla_pure import assume_pure_torch, unique_name

        wrap = assume_pure_torch()
        if wrap is None:
            raise LossOutputException("TracedLoss needs torch_xla.experimental.assume_pure.assume_pure_torch")
        loss_fn = self._loss_fn

        class _Call(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, batch: Any) -> torch.Tensor:
                return loss_fn(self.model, None, batch)

        call = _Call()

        def scoring_forward(*flat: torch.Tensor):
            state = {"model." + n: t for n, t in zip(names, flat[:n_state])}
            batch = tree_unflatten(list(flat[n_state:]), spec)
            return (torch.func.functional_call(call, state, (batch,)),)

        scoring_forward.__name__ = unique_name("neuron_sift_scoring")
        with torch.no_grad():
            return wrap(scoring_forward, use_cache=True)
