"""The two interfaces of the batch data model.

A ``SiftingBatch`` is a batch the loader can sift (keep a subset of samples, in order)
and accumulate (concatenate with others of its kind) until a full batch is ready. A
``SiftingBatchTransform`` converts the user's batch into a ``SiftingBatch`` and back.
"""

import abc
from typing import Any, Sequence, Tuple


class SiftingBatch(abc.ABC):
    """A batch that can be sifted and accumulated. Rows are samples."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of samples."""

    @abc.abstractmethod
    def select(self, indices: Sequence[int]) -> "SiftingBatch":
        """A new batch of the samples at ``indices`` (Python ints, in that order; may be empty)."""

    @abc.abstractmethod
    def concat(self, others: Sequence["SiftingBatch"]) -> "SiftingBatch":
        """A new batch: this batch's samples followed by those of ``others``."""

    def split_at(self, n: int) -> Tuple["SiftingBatch", "SiftingBatch"]:
        """The first ``n`` samples and the rest (how a full batch is cut from pending samples).

        Two ``select`` calls by default; a batch type that can cut without copying overrides it.
        """
        return self.select(range(n)), self.select(range(n, len(self)))


class SiftingBatchTransform(abc.ABC):
    """User hook for batch formats the default handling does not cover.

    ``transform`` turns a batch from the source loader into a ``SiftingBatch``;
    ``reverse_transform`` turns an accumulated ``SiftingBatch`` (always a full batch, never
    empty) back into what the training loop expects.
    """

    @abc.abstractmethod
    def transform(self, batch: Any) -> SiftingBatch:
        ...

    @abc.abstractmethod
    def reverse_transform(self, sifting_batch: SiftingBatch) -> Any:
        ...
