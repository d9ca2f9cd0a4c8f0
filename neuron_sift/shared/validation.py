"""Validation helpers: for the configs of both modes, every refusal a
``SiftConfigValidationException`` naming ``Owner.key``; for plain arguments (counts of
epochs, steps, batches), ``positive_int``.

Why shared: a user sees one style of message whichever config or argument they got wrong.
"""

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, overload

from neuron_sift.exceptions import SiftConfigValidationException

C = TypeVar("C")


def fail(owner: str, key: str, message: str) -> None:
    raise SiftConfigValidationException(f"{owner}.{key}: {message}")


def check_int(owner: str, key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(owner, key, f"expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        fail(owner, key, f"must be >= {minimum}, got {value}")


@overload
def positive_int(value: Any, name: str, *, allow_none: Literal[False] = False, what: str = "") -> int: ...


@overload
def positive_int(value: Any, name: str, *, allow_none: bool, what: str = "") -> int | None: ...


def positive_int(value: Any, name: str, *, allow_none: bool = False, what: str = "") -> int | None:
    """``value`` if it is an int >= 1 (or None, with ``allow_none``), else a ``ValueError``
    naming the argument ``name`` and the value given; ``what`` says what the count is.

    Refuses ``bool`` (an int to Python, never meant as a count) and every other type,
    NumPy integers included: the arguments checked here never took them, and a count that
    arrives as a float or an array scalar is usually a computed value gone wrong.

    Returns:
        ``value`` unchanged (an int >= 1, or None when ``allow_none``).
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        meaning = f" ({what})" if what else ""
        optional = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an int >= 1{meaning}{optional}, got {value!r}")
    return value


def check_bool(owner: str, key: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(owner, key, f"expected a bool, got {type(value).__name__} {value!r}")


def check_real(
    owner: str, key: str, value: Any, low: float, high: float, low_open: bool = False, high_open: bool = False
) -> float:
    """``value`` as a float within ``low``..``high`` (each bound open or closed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        fail(owner, key, f"expected a finite number, got {type(value).__name__} {value!r}")
    v = float(value)
    below = v <= low if low_open else v < low
    above = v >= high if high_open else v > high
    if below or above:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        fail(owner, key, f"must be in {lo}{low}, {high}{hi}, got {value!r}")
    return v


def from_mapping(cls: type[C], owner_key: str, value: Mapping[str, Any], hints: Mapping[str, str] = {}) -> C:
    """Build the dataclass ``cls`` from a dict, naming unknown and missing keys; ``hints``:
    where a key given at the wrong level belongs."""
    if not isinstance(value, Mapping):
        raise SiftConfigValidationException(
            f"{owner_key}: expected a dict of {cls.__name__} fields, got {type(value).__name__} {value!r}"
        )
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = {f.name for f in fields}
    unknown = sorted(set(value) - names, key=repr)  # keys of mixed types cannot be compared
    if unknown:
        notes = [f"{k!r} belongs in {hints[k]}" for k in unknown if k in hints]
        raise SiftConfigValidationException(
            f"{owner_key}: unknown key(s) {unknown} for {cls.__name__}; expected keys {sorted(names)}"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in value]
    if missing:
        raise SiftConfigValidationException(f"{owner_key}: missing key(s) {missing} for {cls.__name__}")
    return cls(**value)


def coerce(cls: type[C], value: Any, argument: str = "sift_config") -> C:
    """``value`` if it is a ``cls``, else ``cls.from_dict(value)`` for a dict; the argument's
    name in the refusal."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls.from_dict(value)  # type: ignore[attr-defined]
    raise SiftConfigValidationException(f"{argument}: expected a {cls.__name__} or a dict, got {type(value).__name__}")
