"""The backend interface the engine and loader rely on."""

import abc

import torch


class Backend(abc.ABC):
    """Device placement, host reads and step boundaries for one device."""

    name: str = "base"

    def __init__(self, device: torch.device):
        self.device = device

    def scalar(self, value, dtype: torch.dtype) -> torch.Tensor:
        """A device scalar holding ``value`` (data, not a graph constant)."""
        return torch.tensor(value, dtype=dtype, device=self.device)

    @abc.abstractmethod
    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Read ``tensor`` back to the CPU (the one host read per source batch, where any)."""

    def after_step(self) -> None:
        """Called after each source batch's sifting math has been issued."""

    @property
    def gathers_on_device(self) -> bool:
        """Whether fixed-mode selections are gathered on the device without a host read."""
        return False
