"""Modules that moved: their old import paths kept for one release, with a warning.

Why a module-level ``__getattr__`` and not a star import: the warning then names each
attribute a script still reads from the old path, when it reads it, and an old path that
is only imported (never read) stays silent.
"""

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_module(old: str, new: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of the module ``old`` that moved to ``new``: each attribute is
    read from ``new``, with a ``DeprecationWarning`` naming both paths."""

    def __getattr__(name: str) -> Any:
        target = importlib.import_module(new)
        try:
            value = getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} (moved to {new!r}) has no attribute {name!r}") from None
        warnings.warn(f"{old}.{name} moved to {new}.{name}; {old} goes in a later release", DeprecationWarning, 2)
        return value

    return __getattr__
