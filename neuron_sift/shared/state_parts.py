"""One protocol for a part of a loader's state, the one way both loaders compose theirs.

Why one protocol: a loader's checkpoint is its parts' states under their names, and a
state is user input (a file, maybe edited, maybe of another run). Each part saves itself
(``state_dict``), refuses a state it cannot restore without changing anything
(``check_state``: a ``ValueError`` naming the field, ``state_checks.py``'s messages) and
restores one (``load_state_dict``). A loader checks every part's state before it loads any
(``check_parts``), so a refused state leaves the loader as it was. What a part needs to
judge its state (its table's size, its loader's history length) it is given when it is
made, never through the call: the three methods take the same arguments on every part.
"""

from collections.abc import Mapping
from typing import Any, Protocol

from neuron_sift.shared.state_checks import need_mapping


class StatePart(Protocol):
    """A part of a loader whose state is a part of the loader's checkpoint."""

    def state_dict(self) -> Any:
        """The part's state: plain values and CPU tensors (loads with ``weights_only=True``)."""
        ...

    def check_state(self, state: Any) -> None:
        """Refuse ``state`` (a ``ValueError`` naming the field) unless ``load_state_dict``
        can restore it; changes nothing."""
        ...

    def load_state_dict(self, state: Any) -> None:
        """Restore ``state`` (one ``check_state`` accepts)."""
        ...


def check_parts(parts: Mapping[str, StatePart], state: Mapping[str, Any]) -> None:
    """Every part's check of its own state (``state[name]``), before any part loads."""
    need_mapping(state, "the state", tuple(parts))
    for name, part in parts.items():
        part.check_state(state[name])
