"""The iterator-lifetime rule every loader of the package follows: a newer ``iter()`` (or a
``load_state_dict()``) voids the iterators handed out before it.

Why: a loader has one position. Two live iterators over it would interleave and each
would skip what the other took, so an older one refuses to go on instead.
"""


class IteratorGeneration:
    """Numbers each iteration; an iterator holds its number and checks it before each step."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._current = 0

    def start(self) -> int:
        """A new iteration: returns its number; every earlier one is void from now on."""
        self._current += 1
        return self._current

    def void_all(self) -> None:
        """Void every iterator handed out so far (a restored state starts over)."""
        self._current += 1

    def is_current(self, number: int) -> bool:
        return number == self._current

    def check(self, number: int) -> None:
        """Raise if iteration ``number`` was voided by a newer one."""
        if number != self._current:
            raise RuntimeError(f"{self.owner}: a new iteration was started; this iterator is no longer valid")
