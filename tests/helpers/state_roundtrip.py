"""A state as a user gets it back from disk: ``torch.save``, then ``torch.load`` with
``weights_only=True``, the loading mode the checkpoints must survive (and torch's default
since 2.6). Through a buffer, not a file: the bytes are what matters, not the path."""

import io
from typing import Any

import torch


def roundtrip(state: Any) -> Any:
    """``state`` saved with ``torch.save`` and loaded back with ``torch.load(..., weights_only=True)``."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)
