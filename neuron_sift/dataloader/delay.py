"""``sift_delay``: the first source batches of training pass through unchanged.

Counted from the start of training (or of every epoch with ``repeat_delay_per_epoch``);
during the delay the loss history is still empty, so there is nothing to judge a loss
against, and the source batches are training steps too.
"""


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

    def load_state_dict(self, state: dict) -> None:
        self.progress = int(state["progress"])
