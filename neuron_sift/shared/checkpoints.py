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
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_FORMATS: list["StateFormat"] = []


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
        return {"kind": self.kind, "version": self.version, **parts}

    def read(self, state: Any) -> dict[str, Any]:
        """``state`` in the current layout, or a ``ValueError`` saying what it is instead."""
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
