"""One pass of a ``SiftingDataloader`` over its source (an epoch): the iterator that owns
the pass's position.

Per source batch: transform to a ``SiftingBatch``, score every sample (``batch_scorer.py``:
the user's loss in an eval-mode, no-grad forward pass, by default), select (``neuron_sift.engine``), and add the
kept samples to the backend's pending store; every time ``batch_size`` kept samples are
pending (or, under data-parallel agreement, as many batches as every rank has), one
batch is emitted in the user's own format.

The epoch's loop pulls source batches one at a time (``SourceReader``), so its look-ahead
is a step of the same loop: before the epoch's last planned batch is yielded, the source
batches still left are scored. They can only add pending samples (the plan is exact), but
a consumer that stops after ``len(loader)`` batches, as Lightning and the Hugging Face
Trainer do, would otherwise never pull them, and their samples would go unseen.

Counting rules (see README): ``sift_delay`` counts source batches from the start of
training, which during the delay are passed through unchanged and so are training steps
too. Kept samples not yet emitted at the end of an epoch are carried into the next epoch
and emitted first; nothing is repeated. Samples are dropped only under data-parallel
agreement in probabilistic mode, when a rank keeps more than its peers and its pending
samples would pass ``max_pending`` (counted, logged; see ``SiftingCounts``).
"""

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.dataloader.parts import PassPosition, SiftingParts
from neuron_sift.dataloader.sample_ids import SampleIds
from neuron_sift.exceptions import UnsupportedDataFormatException, add_context
from neuron_sift.shared.logs import LOADER_LOGGER

logger = logging.getLogger(LOADER_LOGGER)


class SourceReader:
    """The source loader's batches of one epoch (``epoch``: its 0-based index, for the notes),
    pulled one at a time, with their index.

    The source loader's own exception (its type and traceback, e.g. a worker's error
    re-raised by DataLoader) propagates unchanged apart from a note saying which batch failed.
    """

    def __init__(self, source: Any, epoch: int, ids: SampleIds | None = None):
        self._source = source
        self._epoch = epoch
        self._ids = ids
        self._it: Iterator[Any] | None = None
        self._index = 0
        self._done = False

    def next(self) -> tuple[int, Any] | None:
        """The next ``(index, batch)``, or None at the end of the epoch."""
        if self._done:
            return None
        if self._it is None:
            self._it = iter(self._source)
        try:
            batch = next(self._it)
        except StopIteration:
            self.close()
            return None
        except Exception as exc:
            add_context(
                exc,
                f"neuron_sift: while loading source batch {self._index} of epoch {self._epoch} from orig_dataloader",
            )
            raise
        if self._ids is not None:
            self._ids.advance()
        index = self._index
        self._index += 1
        return index, batch

    def close(self) -> None:
        """Let go of the source iterator (and its DataLoader workers)."""
        self._done = True
        self._it = None


class SiftingPass:
    """Iterates one epoch (or the rest of a resumed one) of ``loader``: one pass over its source.

    ``number``: this iteration's number from ``loader.iterations``; a newer ``iter()`` or
    a ``load_state_dict()`` voids it. The loader keeps only the number, never the
    iterator, so an abandoned epoch (and its DataLoader workers) is freed with it.
    ``skip``: source batches a checkpoint had already consumed (loaded, not scored);
    ``planned``: the batches this epoch emits when known in advance (fixed mode), which
    fixes the point of the look-ahead.
    """

    def __init__(self, loader: SiftingParts, number: int, position: PassPosition, skip: int, planned: int | None):
        self.loader = loader
        self.number = number
        self.position = position
        self.skip = skip
        self.planned = planned
        self.emitted = 0
        self._sources = SourceReader(loader.source, position.index, loader.sample_ids)
        self._batches = self._run()

    def __iter__(self) -> "SiftingPass":
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    # -- the epoch's loop ----------------------------------------------------------------------

    def _run(self) -> Iterator[Any]:
        sl = self.loader
        like: tuple[int, Any] | None = None  # a skipped source batch, to bind restored samples
        try:
            while True:
                item = self._sources.next()
                if item is None:
                    break
                index, source = item
                if index < self.skip:  # resuming mid-epoch: consumed before the checkpoint
                    like = item
                    continue
                sl.iterations.check(self.number)
                if like is not None:
                    yield from self._resume_emission(*like)
                    like = None
                if sl.delay.take():
                    sl.counts.delayed(self._count_delayed(source, index))
                    self.position.consumed = index + 1
                    self._before_yield()
                    sl.payback.yielding()
                    yield source
                    sl.payback.resumed()
                    continue
                start = time.perf_counter()
                self._sift(source, index)
                yield from self._emit(start)
            if sl.iterations.is_current(self.number):
                if like is not None:
                    yield from self._resume_emission(*like)  # every source batch was consumed
                if sl.agreement.coordinated:  # the last agreement of the epoch: every rank ends even
                    yield from self._emit(time.perf_counter(), end_of_epoch=True)
                self.position.in_progress = False
                sl.nonfinite_notice.flush()
                sl.drop_notice.flush()
            sl.payback.pass_ended()  # at the pass's own end (not when an abandoned one is collected)
        finally:  # do not hold the source iterator (and its DataLoader workers) past the epoch
            self._sources.close()

    def _before_yield(self) -> None:
        """Before the epoch's last planned batch, score the source batches still left (the
        look-ahead): a step of this epoch's loop, pulling from the same reader."""
        self.emitted += 1
        if self.planned is None or self.emitted != self.planned:
            return
        self.planned = None
        while True:
            item = self._sources.next()
            if item is None:
                return
            self._sift(item[1], item[0])

    def _resume_emission(self, index: int, like: Any) -> Iterator[Any]:
        """Restored samples go back in before anything is scored, and the batches the
        checkpoint had ready (or agreed) are emitted first, as the uninterrupted run would
        have emitted them before scoring its next source batch with the weights of then.

        ``like``: a source batch consumed before the checkpoint, transformed only to give the
        restored samples their container types again.
        """
        sl = self.loader
        if sl.pending is None or not sl.pending.has_unbound:
            return
        transformed = self._transform(like, f"source batch {index} of epoch {self.position.index} (resume)")
        if not isinstance(transformed, SiftingBatch) or len(transformed) == 0 or sl.batch_size is None:
            return
        sl.pending.bind(transformed)
        yield from self._emit(time.perf_counter(), resumed=True)

    # -- one source batch ----------------------------------------------------------------------

    def _transform(self, source: Any, where: str) -> Any:
        try:
            return self.loader.phases.run("transform", self.loader.batch_transforms.transform, source)
        except Exception as exc:
            add_context(exc, f"neuron_sift: while transforming {where}")
            raise

    def _count_delayed(self, source: Any, index: int) -> int:
        return len(self._transform(source, f"source batch {index} of epoch {self.position.index} (sift_delay)"))

    def _sift(self, source: Any, index: int) -> None:
        """Score and select one source batch; its kept samples join the pending store."""
        sl = self.loader
        where = f"source batch {index} of epoch {self.position.index}"
        transformed = self._transform(source, where)
        if not isinstance(transformed, SiftingBatch):
            raise UnsupportedDataFormatException(
                f"batch_transforms.transform must return a SiftingBatch (e.g. ListBatch, TensorBatch), "
                f"got {type(transformed).__name__}"
            )
        n = len(transformed)
        counts = sl.counts
        counts.num_source_batches += 1
        if n == 0:
            self.position.consumed = index + 1
            return
        store = sl.pending_store_for(transformed)
        b = sl.batch_size
        assert b is not None  # set from the first non-empty batch at the latest
        store.bind(transformed)  # restored samples first, ahead of anything kept from now on
        scored, original = store.prepare(transformed, source)
        ids = sl.sample_ids.of(source, n) if sl.sample_ids is not None else None
        try:
            sl.payback.scoring_starts()
            losses = sl.phases.run("calculate_relevance_values", sl.scorer.score, scored, original, ids)
            sl.payback.scoring_ends()
        except Exception as exc:
            add_context(exc, f"neuron_sift: while scoring {where}")
            raise
        out = sl.phases.run("should_sift", sl.sifter.step, losses, n, b)
        kept = sl.phases.run("sift", store.read_kept, sl.sifter, scored, out, n)
        n_admitted = sl.agreement.admitted(kept.count, len(store), b)
        with self._context(f"accumulating the kept samples of {where}"):
            sl.phases.run("accumulate", store.add, scored, out, kept, n_admitted)
        counts.scored(n, kept.count, n_admitted)
        self.position.consumed = index + 1
        sl.nonfinite_notice.report(kept.nonfinite, where)
        if sl.agreement.coordinated:
            sl.drop_notice.report(kept.count - n_admitted, where)
        if sl.log_batch_data:  # costly: reads losses and the selection back to the host
            values = sl.backend.to_host(losses.float())[:n]
            indices = kept.indices
            if indices is None:
                indices, _ = sl.sifter.read_selection(out)
            logger.info("relevance_values: %s", values.tolist())
            picked = torch.as_tensor(indices, dtype=torch.long)
            logger.info("relevance_values_kept: %s", values[picked].tolist())
            logger.info("kept_indices: %s", picked.tolist())

    def _learn(self, batch: SiftingBatch, out_batch: Any) -> None:
        """The scoring model's own step on the batch going to the loop (when it trains one)."""
        sl = self.loader
        if sl.scorer.scoring_optimizer is not None:
            sl.payback.learning_starts()
            sl.phases.run("train_scorer", sl.scorer.learn, batch, out_batch)
            sl.payback.learning_ends()

    @contextlib.contextmanager
    def _context(self, what: str) -> Iterator[None]:
        """Say which source batch an error of the library's own joining came from."""
        try:
            yield
        except UnsupportedDataFormatException as exc:
            add_context(exc, f"neuron_sift: while {what}")
            raise

    # -- emission ------------------------------------------------------------------------------

    def _emit(self, start: float, end_of_epoch: bool = False, resumed: bool = False) -> Iterator[Any]:
        """Emit the ready batches (uncoordinated) or the agreed ones (coordinated); ``resumed``
        emits the rest of an agreement a checkpoint was taken in, without a new agreement."""
        sl = self.loader
        b = sl.batch_size
        if b is None:
            return
        store = sl.pending
        if resumed:
            budget = sl.agreement.resumed_budget()
        else:
            budget = sl.agreement.open_budget((len(store) if store is not None else 0) // b, end_of_epoch)
        counts = sl.counts
        while budget is None or budget > 0:
            last = f"source batch {self.position.consumed - 1} of epoch {self.position.index}"
            with self._context(f"joining the kept samples (the last ones from {last})"):
                batch = store.pop() if store is not None else None
            if batch is None:
                if budget:
                    raise RuntimeError(f"internal error: {budget} agreed batches could not be cut")
                return
            if budget is not None:
                budget -= 1
                sl.agreement.spent()
            out_batch = sl.phases.run("reverse_transform", sl.batch_transforms.reverse_transform, batch)
            counts.emitted(len(batch))
            if logger.isEnabledFor(logging.INFO):
                logger.info("num_orig_samples_seen: %d", counts.num_orig_samples_seen)
                logger.info("num_orig_samples_kept: %d", counts.num_orig_samples_kept)
                logger.info("Batch size for next sifted batch: %d", len(batch))
                logger.info("sifted_batch_creation_latency: %.6f", time.perf_counter() - start)
            if sl.log_batch_contents:  # explicit opt-in: sample contents in the log
                logger.info("emitted_batch: %r", out_batch)
            self._learn(batch, out_batch)
            self._before_yield()
            sl.payback.yielding()
            yield out_batch
            sl.payback.resumed()
            start = time.perf_counter()
