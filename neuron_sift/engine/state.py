"""Sifting state: every tensor that decides future selections, on the model's device."""

from dataclasses import dataclass, fields

import torch


@dataclass
class SiftState:
    """Loss-history ring buffer, its write position and fill count, counters, random state.

    ``history`` is ``[H]`` float32; the rest are int64 scalars. ``draws`` counts scored
    source batches and is the counter of the hash RNG (see ``neuron_sift/kernels/random.py``), so the
    random state is just ``(seed, draws)``.
    """

    history: torch.Tensor
    pos: torch.Tensor
    fill: torch.Tensor
    seed: torch.Tensor
    draws: torch.Tensor
    num_scored: torch.Tensor
    num_kept: torch.Tensor
    num_nonfinite: torch.Tensor

    @classmethod
    def create(cls, history_length: int, seed: int, device: torch.device) -> "SiftState":
        def scalar(v: int) -> torch.Tensor:
            return torch.tensor(v, dtype=torch.int64, device=device)

        return cls(
            history=torch.zeros(history_length, dtype=torch.float32, device=device),
            pos=scalar(0),
            fill=scalar(0),
            seed=scalar(seed),
            draws=scalar(0),
            num_scored=scalar(0),
            num_kept=scalar(0),
            num_nonfinite=scalar(0),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to(self, device: torch.device) -> "SiftState":
        """The state on ``device``; each scalar travels as a 1-element vector.

        torch-xla caches 0-dim device data by value, so scalars uploaded as such that happen
        to be equal (the zeros of a fresh state, equal counters of a restored one) become
        one graph input, and the first step after a restore would compile a graph of its
        own. Uploaded as vectors and viewed as scalars on the device, they are distinct
        inputs whatever their values.
        """
        out = {}
        for k, v in self.tensors().items():
            out[k] = v.reshape(1).to(device).reshape(()) if v.dim() == 0 else v.to(device)
        return SiftState(**out)
