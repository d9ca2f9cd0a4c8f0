"""The two interfaces of the batch data model.

A ``SiftingBatch`` is a batch the loader can sift (keep a subset of samples, in order)
and accumulate (concatenate with others of its kind) until a full batch is ready. A
``SiftingBatchTransform`` converts the user's batch into a ``SiftingBatch`` and back.
"""

import abc
from collections.abc import Sequence
from typing import Any


class SiftingBatch(abc.ABC):
    """A batch that can be sifted and accumulated. Rows are samples.

    Implement it (with a ``SiftingBatchTransform``) when the default handling cannot split
    your batches: the loader only ever selects samples by position and concatenates
    batches, so these three methods are all it needs. ``ListBatch`` and ``TensorBatch``
    are ready-made implementations, and the only ones whose pending samples a checkpoint
    can save.
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of samples.

        Returns:
            The number of samples (rows) in the batch.
        """

    @abc.abstractmethod
    def select(self, indices: Sequence[int]) -> "SiftingBatch":
        """A new batch of the samples at ``indices``.

        Args:
            indices: positions, Python ints, in the order the new batch holds them; may be
                empty.

        Returns:
            A new batch of the same type; this batch is left unchanged.
        """

    @abc.abstractmethod
    def concat(self, others: Sequence["SiftingBatch"]) -> "SiftingBatch":
        """A new batch: this batch's samples followed by those of ``others``.

        Args:
            others: batches of the same type (kept samples of later source batches).

        Returns:
            A new batch; the inputs are left unchanged.
        """

    def split_at(self, n: int) -> tuple["SiftingBatch", "SiftingBatch"]:
        """The first ``n`` samples and the rest (how a full batch is cut from pending samples).

        Two ``select`` calls by default; a batch type that can cut without copying overrides it.

        Args:
            n: the number of samples of the first part, ``0 <= n <= len(self)``.

        Returns:
            ``(first, rest)``: the first ``n`` samples and the remaining ones.
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
        """Turn a batch of the source loader into a ``SiftingBatch``.

        Args:
            batch: one batch as the source loader yields it.

        Returns:
            A ``SiftingBatch`` with one row per sample of ``batch``; it is what the loss
            receives as ``transformed_batch``.
        """

    @abc.abstractmethod
    def reverse_transform(self, sifting_batch: SiftingBatch) -> Any:
        """Turn a full batch of kept samples back into the training loop's format.

        Args:
            sifting_batch: exactly one batch size of kept samples (never empty), made of
                rows of ``transform``'s results.

        Returns:
            The batch the training loop receives.
        """


def check_batch_transform(batch_transforms: Any) -> Any:
    """``batch_transforms`` itself, once it has the two methods the loader calls (duck-typed:
    a ``SiftingBatchTransform`` subclass is not required, as in smart_sifting)."""
    for name in ("transform", "reverse_transform"):
        if not callable(getattr(batch_transforms, name, None)):
            raise TypeError(
                f"batch_transforms must have callable transform(batch) and reverse_transform(sifting_batch); "
                f"{type(batch_transforms).__name__} has no {name}"
            )
    return batch_transforms
