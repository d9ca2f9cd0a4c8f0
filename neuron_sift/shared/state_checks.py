"""Checks of a checkpoint's fields: every refusal a ``ValueError`` naming the field (its path
in the state, ``progress.plan.order``), what it holds and what it must hold.

Why before loading: a state is user input (a file, maybe edited, maybe of another run);
a wrong type, shape, dtype or value otherwise surfaces as a NumPy broadcast error, a bare
``IndexError`` or, worse, loads: a position past the plan's end drops the rest of an
epoch, a NaN weight trains a sample with a NaN loss. Each part of a loader checks its own
state with these before any part changes (``config`` checks are ``validation.py``'s).

The checks read each tensor once (a min, a max, a finite test): no copy of a large table
but the boolean masks of the tests themselves.
"""

import numbers
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

INT_IDS = (torch.int32, torch.int64)  # the dtypes plans hold sample ids in


def describe(value: Any) -> str:
    """``value`` for a message: its type, and a short repr of a plain value."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return f"{type(value).__name__} {reprlib.repr(value)}"


def invalid(field: str, message: str) -> NoReturn:
    """Refuse the state: ``field`` (its path in the state) ``message``."""
    raise ValueError(f"invalid checkpoint: {field} {message}")


def need_mapping(value: Any, field: str, keys: Sequence[str] = ()) -> Mapping[str, Any]:
    """``value`` as a dict holding ``keys``."""
    if not isinstance(value, Mapping):
        invalid(field, f"must be a dict, got {describe(value)}")
    missing = [k for k in keys if k not in value]
    if missing:
        invalid(field, f"has no {', '.join(missing)} (a state holds every one of {', '.join(keys)})")
    return value


def need_int(value: Any, field: str, low: int | None = 0, high: int | None = None, what: str = "") -> int:
    """``value`` as an int within ``low..high`` (None: unbounded); ``what``: what the bounds are."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        invalid(field, f"must be an int, got {describe(value)}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        bounds = f"{'' if low is None else low}..{'' if high is None else high}"
        invalid(field, f"must be in {bounds}{f' ({what})' if what else ''}, got {v}")
    return v


def need_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        invalid(field, f"must be a bool, got {describe(value)}")
    return value


def need_real(value: Any, field: str, low: float | None = None) -> float:
    """``value`` as a finite number (at least ``low``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(float(value)):
        invalid(field, f"must be a finite number, got {describe(value)}")
    if low is not None and float(value) < low:
        invalid(field, f"must be >= {low}, got {value!r}")
    return float(value)


def need_choice(value: Any, field: str, choices: Sequence[Any]) -> Any:
    if not isinstance(value, str) or value not in choices:
        invalid(field, f"must be one of {', '.join(map(repr, choices))}, got {describe(value)}")
    return value


def need_vector(
    value: Any, field: str, dtypes: torch.dtype | tuple[torch.dtype, ...], length: int | None = None, of: str = ""
) -> torch.Tensor:
    """``value`` as a 1-D tensor of one of ``dtypes`` with ``length`` entries (``of``: what they
    are one of, for the message)."""
    allowed = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    names = " or ".join(str(d) for d in allowed)
    if not isinstance(value, torch.Tensor):
        invalid(field, f"must be a {names} tensor, got {describe(value)}")
    if value.dim() != 1:
        invalid(field, f"must be a 1-D tensor, got shape {list(value.shape)}")
    if not value.is_cpu:
        invalid(field, f"must be a CPU tensor, got one on {value.device} (load the file with map_location='cpu')")
    if length is not None and value.shape[0] != length:
        invalid(field, f"must hold {length} entries{f' (one per {of})' if of else ''}, got {value.shape[0]}")
    if value.dtype not in allowed:
        invalid(field, f"must be a {names} tensor, got {value.dtype}")
    return value


def need_ids(value: Any, field: str, n: int, length: int | None = None) -> np.ndarray:
    """``value`` as sample ids (an int32 or int64 vector), each in ``0..n-1``; returned as a
    NumPy view (no copy)."""
    ids = need_vector(value, field, INT_IDS, length).numpy()
    if ids.size:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= n:
            invalid(field, f"holds sample id {low if low < 0 else high}, outside the dataset's 0..{n - 1}")
    return ids


def need_distinct(index: np.ndarray, field: str, size: int) -> np.ndarray:
    """``index`` (entries in ``0..size-1``: ids, or a rank's slots of them) holds none twice;
    returns the mask of those it holds (one byte per entry of ``size``: no sort)."""
    held = np.zeros(size, dtype=bool)
    held[index] = True
    if int(np.count_nonzero(held)) != index.size:
        invalid(field, "holds a sample id twice")
    return held


def need_values(
    value: torch.Tensor, field: str, low: float, high: float | None = None, low_open: bool = False, nan: bool = False
) -> None:
    """Every entry of ``value`` (a CPU vector) finite (or NaN where ``nan``), at least ``low``
    (above it when ``low_open``) and at most ``high``; no copy of the entries."""
    v = value.detach().numpy()
    if not v.size:
        return
    if v.dtype.kind == "f":
        if not nan and np.isnan(v).any():
            invalid(field, "holds NaN")
        if np.isinf(v).any():
            invalid(field, "holds an infinite value")
        lo, hi = float(np.fmin.reduce(v)), float(np.fmax.reduce(v))  # NaN left out
        if np.isnan(lo):  # every entry NaN
            return
    else:
        lo, hi = int(v.min()), int(v.max())
    if lo < low or (low_open and lo == low):
        invalid(field, f"holds {lo}, must be {'>' if low_open else '>='} {low}")
    if high is not None and hi > high:
        invalid(field, f"holds {hi}, must be <= {high}")
