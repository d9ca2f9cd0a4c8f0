"""Kept samples wait here until a full batch can be emitted."""

from typing import List, Optional

from neuron_sift.data_model.data_model_interface import SiftingBatch


class BatchAccumulator:
    """Concatenates kept pieces and cuts batches of exactly ``batch_size`` samples.

    Pieces are concatenated once per emitted batch (not once per piece), so the cost of
    accumulation is linear in the samples kept. Whatever is left over stays pending: it
    is carried into the next epoch and emitted first there.
    """

    def __init__(self) -> None:
        self._pieces: List[SiftingBatch] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, piece: SiftingBatch) -> None:
        n = len(piece)
        if n:
            self._pieces.append(piece)
            self._size += n

    def pop(self, batch_size: int) -> Optional[SiftingBatch]:
        """The next full batch, or None while fewer than ``batch_size`` samples wait."""
        if self._size < batch_size:
            return None
        first, rest = self._pieces[0], self._pieces[1:]
        merged = first.concat(rest) if rest else first
        total = len(merged)
        if total == batch_size:
            self._pieces, self._size = [], 0
            return merged
        out, remainder = merged.split_at(batch_size)
        self._pieces, self._size = [remainder], total - batch_size
        return out

    def pending(self) -> List[SiftingBatch]:
        return list(self._pieces)
