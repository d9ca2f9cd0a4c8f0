"""The checkpoint envelope every stateful object of the package writes and reads.

Why an envelope: a checkpoint outlives the code that wrote it and may be handed to the
wrong object. A state names its ``kind`` (the class whose ``state_dict()`` wrote it) and
its ``version`` (its layout); a reader either reads it exactly (converting an older layout
it knows) or refuses it, saying what it got, what it reads, and which ``load_state_dict()``
the state belongs to; never a half-understood resume.

A state is a plain dict ``{"kind": ..., "version": ..., <part>: <the part's state>, ...}``
that loads with ``torch.load(..., weights_only=True)``. States written before ``kind`` was
saved are recognised by their keys (each format says how, ``legacy``;
``unversioned``: the version such a state has when it saved none either).

Why a checksum (``"checksum"``, written by ``write`` and verified by ``read``): a state that
was changed after ``state_dict()`` wrote it (a damaged file, a flipped byte that turns one
weight into another, a state edited by hand) would otherwise load without a word and run
something else than the run it claims to resume. The checksum is a SHA-256 of the state's
content in a canonical form (``content_checksum``): every tensor's dtype, shape and bytes,
every plain value, dict keys sorted; one pass over the tensors' memory, no copy. A state
nested in another (a wrapper's state holding its loader's) enters its holder's checksum by
its own checksum: it is verified when its own reader reads it, so each byte is hashed once
per save. States written before checksums existed have none and load as before.
"""

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

_FORMATS: list["StateFormat"] = []

CHECKSUM = "checksum"  # the envelope's field holding the digest of everything else in the state
_ALGORITHM = "sha256:"


@dataclass(frozen=True)
class StateFormat:
    """One kind of state: its current ``version``, the ``parts`` a current state must hold,
    the converters of older layouts (``upgrades``: version -> function returning the current
    layout) and how to recognise a state written before ``kind`` was saved (``legacy``)."""

    kind: str
    version: int
    parts: tuple[str, ...]
    upgrades: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = field(default_factory=dict)
    legacy: Callable[[dict[str, Any]], bool] | None = None
    unversioned: int | None = None  # the version of a legacy state that saved none

    def __post_init__(self) -> None:
        _FORMATS.append(self)

    @property
    def readable_versions(self) -> tuple[int, ...]:
        return tuple(sorted({self.version, *self.upgrades}))

    def write(self, parts: Mapping[str, Any]) -> dict[str, Any]:
        """The state of ``parts`` (each part's own state under its name) in the envelope."""
        missing = [p for p in self.parts if p not in parts]
        if missing:  # a writer's bug, not a user's input
            raise AssertionError(f"{self.kind} state written without {', '.join(missing)}")
        state = {"kind": self.kind, "version": self.version, **parts}
        state[CHECKSUM] = content_checksum(state)
        return state

    def read(self, state: Any, verify: bool = True) -> dict[str, Any]:
        """``state`` in the current layout, or a ``ValueError`` saying what it is instead;
        ``verify=False`` skips the checksum (for a reader that only compares a few fields of
        states another reader loads, and verifies)."""
        article = "an" if self.kind[0] in "AEIOU" else "a"
        kind = state_kind(state)
        if kind != self.kind:
            if kind is not None:
                what = f"it comes from {kind}.state_dict(); load it with {kind}.load_state_dict()"
            elif isinstance(state, dict) and "version" in state:
                what = f"got a dict of version {state['version']!r} with neither a kind nor this kind's parts"
            else:
                what = f"got a {type(state).__name__} that is no loader's state"
            raise ValueError(
                f"not {article} {self.kind} state: {what} ({article} {self.kind} reads only what "
                f"{self.kind}.state_dict() returns)"
            )
        version = state.get("version", self.unversioned)
        readable = self.readable_versions
        if version not in readable:
            raise ValueError(
                f"not {article} {self.kind} state of a version this neuron_sift reads: version {version!r}; "
                f"readable versions: {', '.join(map(str, readable))} (current {self.version})"
            )
        if verify:
            verify_checksum(state, f"{article} {self.kind} state")
        if version != self.version:
            state = self.upgrades[version](state)
        missing = [p for p in self.parts if p not in state]
        if missing:
            raise ValueError(f"{self.kind} state version {version} is incomplete: no {', '.join(missing)}")
        return state


def state_kind(state: Any) -> str | None:
    """Which class's ``state_dict()`` wrote ``state`` (its ``kind``, or recognised by a known
    format's ``legacy`` keys), or None."""
    if not isinstance(state, dict):
        return None
    kind = state.get("kind")
    if isinstance(kind, str):
        return kind
    for fmt in _FORMATS:
        if fmt.legacy is not None and fmt.legacy(state):
            return fmt.kind
    return None


def require(state: Mapping[str, Any], keys: Any, what: str) -> None:
    """Refuse ``state`` (described as ``what``) unless it holds every one of ``keys``."""
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"{what} is incomplete: no {', '.join(missing)}")


def content_checksum(state: Mapping[str, Any]) -> str:
    """The checksum of ``state``'s content: everything but its own ``checksum`` field (see
    the module's docstring)."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in state.items() if k != CHECKSUM})
    return _ALGORITHM + digest.hexdigest()


def verify_checksum(state: Mapping[str, Any], what: str) -> None:
    """Refuse ``state`` (described as ``what``) if it has a checksum that its content does not
    match; a state without one (written before checksums existed) passes."""
    saved = state.get(CHECKSUM)
    if saved is None:
        return
    if not isinstance(saved, str) or not saved.startswith(_ALGORITHM):
        raise ValueError(
            f"{what} with a checksum this neuron_sift does not read: {saved!r} (expected {_ALGORITHM}<hex digest>)"
        )
    if content_checksum(state) != saved:
        raise ValueError(
            f"{what}: the state's content does not match its checksum: it was changed after state_dict() wrote it "
            "(a damaged or truncated file, or a state edited by hand). Load the file state_dict() wrote, as saved; "
            "a state changed on purpose is refused too: a changed state is not one the run can be trusted to resume"
        )


def _sealed(value: dict[Any, Any]) -> bool:
    """Whether ``value`` is a state of this envelope with its own checksum (verified by its reader)."""
    saved = value.get(CHECKSUM)
    return isinstance(value.get("kind"), str) and isinstance(saved, str) and saved.startswith(_ALGORITHM)


def _feed(digest: Any, value: Any) -> None:
    """``value`` into ``digest`` in a canonical form: a type tag, then the value's bytes
    (lengths before variable-size content, so no two values feed the same bytes)."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        digest.update(f"T{t.dtype}{tuple(t.shape)}|".encode())
        if t.numel():  # the tensor's own memory (a copy only for a non-contiguous or non-CPU one)
            flat = t.cpu().contiguous().reshape(-1)
            digest.update(flat.view(torch.uint8).numpy())
    elif isinstance(value, np.ndarray):
        digest.update(f"A{value.dtype.str}{value.shape}|".encode())
        digest.update(np.ascontiguousarray(value).view(np.uint8))
    elif isinstance(value, dict):
        if _sealed(value):
            digest.update(f"C{value[CHECKSUM]}|".encode())
            return
        digest.update(f"D{len(value)}|".encode())
        for key in sorted(value, key=lambda k: (type(k).__name__, repr(k))):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)}|".encode())
        for item in value:
            _feed(digest, item)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        digest.update(f"S{len(data)}|".encode())
        digest.update(data)
    elif isinstance(value, bytes):
        digest.update(f"Y{len(value)}|".encode())
        digest.update(value)
    elif isinstance(value, float):
        digest.update(f"F{value.hex()}|".encode())
    elif value is None or isinstance(value, (bool, int)):
        digest.update(f"{type(value).__name__[0]}{value!r}|".encode())
    else:  # another plain value: its type and repr
        text = f"O{type(value).__module__}.{type(value).__qualname__}:{value!r}".encode()
        digest.update(f"{len(text)}|".encode())
        digest.update(text)
