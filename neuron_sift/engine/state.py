"""Sifting state: every tensor that decides future selections, on the model's device."""

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from neuron_sift.shared.state_checks import describe, invalid, need_int, need_mapping, need_values, need_vector

MAX_SEED = 2**31 - 1  # seeds are taken modulo it (``Sifter``)


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

    @staticmethod
    def check(state: Any, history_length: int) -> None:
        """Refuse a saved state (CPU tensors by name, as ``tensors()``) that is not a loss
        history of ``history_length`` finite losses with its int64 scalars in range (the
        ring buffer's write position below its length, its fill at most that, no more kept
        than scored): a ``ValueError`` naming the field (``sift_state.pos``)."""
        names = [f.name for f in fields(SiftState)]
        need_mapping(state, "sift_state", names)
        unknown = sorted(map(str, set(state) - set(names)))
        if unknown:
            invalid("sift_state", f"has unknown entries {', '.join(unknown)}")
        history = need_vector(state["history"], "sift_state.history", torch.float32, history_length, "loss kept")
        need_values(history, "sift_state.history", -np.inf)  # any finite loss; never NaN or infinite
        highs = {"pos": history_length - 1, "fill": history_length, "seed": MAX_SEED - 1}
        values = {}
        for name in names[1:]:
            field, value = f"sift_state.{name}", state[name]
            if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.dtype != torch.int64:
                invalid(field, f"must be an int64 scalar tensor, got {describe(value)}")
            values[name] = need_int(int(value), field, 0, highs.get(name))
        if values["num_kept"] > values["num_scored"]:
            invalid("sift_state.num_kept", f"is {values['num_kept']}, more than the {values['num_scored']} scored")

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
