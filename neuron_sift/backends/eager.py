"""Plain PyTorch on CPU or CUDA: the math runs op by op; reads are ordinary ``.cpu()``."""

import torch

from neuron_sift.backends.base import Backend


class EagerBackend(Backend):
    name = "eager"

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().cpu()
