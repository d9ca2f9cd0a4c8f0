"""Modules that moved: their old import paths kept until a stated release, with a warning.

Why a module-level ``__getattr__`` and not a star import: the warning then names each
attribute a script still reads from the old path, when it reads it, and an old path that
is only imported (never read) stays silent.

Why a registry (``MOVED``): every shim states the release whose code no longer has it, and
a test reads them all (``tests/neuron_sift/shared/test_moved.py``): it fails once the
package's version reaches a shim's ``remove_in``, so no shim outlives its promise.
"""

import importlib
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

# Every moved module's old path -> (its new path, the release that removes the old one).
MOVED: dict[str, tuple[str, str]] = {}

_RELEASE = re.compile(r"\d+\.\d+\.\d+")


def moved_module(old: str, new: str, remove_in: str, renamed: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """The ``__getattr__`` of the module ``old`` that moved to ``new``: each attribute is
    read from ``new`` (under its new name where ``renamed`` maps an old name to one), with a
    ``DeprecationWarning`` naming both paths and ``remove_in``, the release (``"0.9.0"``)
    whose code no longer has ``old``. The shim is recorded in ``MOVED``."""
    if not _RELEASE.fullmatch(remove_in):
        raise ValueError(f"remove_in must be a release like '0.9.0', got {remove_in!r}")
    names = dict(renamed or {})
    MOVED[old] = (new, remove_in)

    def __getattr__(name: str) -> Any:
        target = importlib.import_module(new)
        new_name = names.get(name, name)
        try:
            value = getattr(target, new_name)
        except AttributeError:
            raise AttributeError(f"module {old!r} (moved to {new!r}) has no attribute {name!r}") from None
        warnings.warn(f"{old}.{name} moved to {new}.{new_name}; {old} is removed in {remove_in}", DeprecationWarning, 2)
        return value

    return __getattr__
