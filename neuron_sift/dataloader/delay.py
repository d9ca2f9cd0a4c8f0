"""``sift_delay``: the first source batches of training pass through unchanged.

Counted from the start of training (or of every epoch with ``repeat_delay_per_epoch``);
during the delay the loss history is still empty, so there is nothing to judge a loss
against, and the source batches are training steps too.
"""

from typing import Any

from neuron_sift.shared.state_checks import need_int, need_mapping


class SiftDelay:
    """How many of the delayed source batches have passed; its ``state_dict`` carries that."""

    def __init__(self, batches: int, per_epoch: bool):
        self.batches = batches
        self.per_epoch = per_epoch
        self.progress = 0

    def new_epoch(self) -> None:
        if self.per_epoch:
            self.progress = 0

    def take(self) -> bool:
        """Whether the next source batch is delayed (then it is counted as passed)."""
        if self.progress < self.batches:
            self.progress += 1
            return True
        return False

    def state_dict(self) -> dict:
        return {"progress": self.progress}

    def check_state(self, state: Any) -> None:
        """Refuse a state that is not a count of delayed source batches passed (an int >= 0;
        one above ``sift_delay`` is a run's with a longer delay: no batch is delayed)."""
        need_int(need_mapping(state, "delay", ("progress",))["progress"], "delay.progress", 0)

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.progress = int(state["progress"])
