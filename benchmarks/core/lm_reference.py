"""The single-pass LM task's cheaper scorers: a small model, a reference model trained on
held-out clean text, and the reference table it writes.

RHO-LOSS's recipe at this task's scale. The reference model is a small byte transformer
(``SMALL_SHAPE``, about an eighth of the learner's multiply-adds per window) trained on the
corpus's reference slice (``Corpus.reference``: clean source files that are neither in the
stream nor in the held-out metric), then run once, without gradients, over the windows an
arm may read, through the library's public ``score_dataset``; the table it writes is what
the per-batch loader looks up by window index. The scoring model of the scorer arms has the
same small shape, trained by the loader on the batches it yields. Whatever an arm spends
here runs while its clock runs and is timed as its ``scoring`` part: a reference costs
every arm that uses it, every time.
"""

import math
import tempfile
from typing import Any

import torch
from torch.utils.data import TensorDataset

from benchmarks.core.fairness import CosineSchedule
from benchmarks.core.lm_context import LMContext
from benchmarks.tasks.lm_corpus import stream_order
from benchmarks.tasks.lm_model import ByteTransformer, LMShape, sequence_losses
from neuron_sift import ReferenceTable, score_dataset
from neuron_sift.loss.abstract_sift_loss_module import Loss

SMALL_LAYERS, SMALL_D, SMALL_HEADS = 1, 64, 2
READ_MARGIN = 1.25  # windows scored beyond the expected read, for a probabilistic keep's spread


class WindowLoss(Loss):
    """Each window's mean next-byte cross-entropy, untimed (the caller times the whole)."""

    def loss(self, model: torch.nn.Module, transformed_batch: Any, original_batch: Any = None) -> torch.Tensor:
        seq = original_batch[0].to(next(model.parameters()).device)
        return sequence_losses(model, seq)


def small_shape(ctx: LMContext) -> LMShape:
    return LMShape(layers=SMALL_LAYERS, d_model=SMALL_D, heads=SMALL_HEADS, context=ctx.config.shape.context)


def small_model(ctx: LMContext, salt: int) -> torch.nn.Module:
    """A small byte transformer, its weights from the seed and ``salt``, on the run's device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed * 7919 + salt)
        model = ByteTransformer(small_shape(ctx))
    return model.to(ctx.device)


def train_reference(ctx: LMContext) -> torch.nn.Module:
    """The reference model: ``config.reference_steps`` Adam steps of ``batch_size`` windows of
    the reference slice (cycled in a seeded order), warm-up then cosine decay."""
    model = small_model(ctx, salt=1)
    ref = ctx.corpus.reference
    if ref.shape[0] < ctx.config.batch_size:
        raise ValueError(
            f"the corpus' reference slice holds {ref.shape[0]} windows, fewer than a batch of {ctx.config.batch_size}"
        )
    steps, b = ctx.config.reference_steps, ctx.config.batch_size
    optimizer = torch.optim.Adam(model.parameters(), lr=ctx.config.lr)
    schedule = CosineSchedule(optimizer, total_steps=steps, warmup=ctx.config.warmup)
    g = torch.Generator().manual_seed(ctx.seed + 4242)
    order = torch.cat([torch.randperm(ref.shape[0], generator=g) for _ in range(math.ceil(steps * b / ref.shape[0]))])
    model.train()
    for i in range(steps):
        seq = ref[order[i * b : (i + 1) * b]].to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        sequence_losses(model, seq).mean().backward()
        optimizer.step()
        schedule.step()
        if ctx.sync:
            ctx.sync()
    return model.eval()


def windows_read(ctx: LMContext, kept_share: float, exact: bool) -> int:
    """How many windows of the stream an arm keeping ``kept_share`` of each source batch
    (after ``sift_delay`` whole ones) reads for its step budget (``READ_MARGIN`` more where
    the share kept is a probability, not an ``exact`` count)."""
    b = ctx.config.batch_size
    sifted = max(ctx.planned - ctx.config.sift_delay, 0) * b
    margin = 1.0 if exact else READ_MARGIN
    return min(ctx.corpus.train.shape[0], ctx.config.sift_delay * b + math.ceil(margin * sifted / kept_share) + b)


def reference_table(ctx: LMContext, model: torch.nn.Module, order: torch.Tensor, count: int) -> ReferenceTable:
    """The reference model's loss of the first ``count`` windows of the stream ``order``,
    written by ``score_dataset`` into a temporary folder and read back from it."""
    dataset = TensorDataset(ctx.corpus.train, torch.arange(ctx.corpus.train.shape[0]))
    with tempfile.TemporaryDirectory(prefix="lm-reference-") as folder:
        score_dataset(
            model,
            dataset,
            WindowLoss(),
            folder,
            batch_size=ctx.config.batch_size,
            ids=order[:count],
            device=ctx.device,
            distributed=False,
            progress=False,
            save_every=10**6,
            description=f"lm reference: {small_shape(ctx).describe()}, {ctx.config.reference_steps} steps",
        )
        table = ReferenceTable.load(folder)
        table = ReferenceTable.from_losses(table.losses(), fingerprint=table.fingerprint, description=table.description)
    return table


def scorer_kwargs(ctx: LMContext, kept_share: float, exact: bool, reference: bool, scoring_model: bool) -> dict:
    """What a scorer arm adds to its ``SiftingDataloader`` (the reference model trained and
    its table written, the scoring model and its optimizer made): the caller times it."""
    kwargs: dict = {}
    if reference:
        order = stream_order(ctx.corpus.train.shape[0], ctx.seed)
        table = reference_table(ctx, train_reference(ctx), order, windows_read(ctx, kept_share, exact))
        kwargs.update(reference=table, sample_ids=window_ids)
    if scoring_model:
        scorer = small_model(ctx, salt=2).train()
        kwargs.update(scoring_model=scorer, scoring_optimizer=torch.optim.Adam(scorer.parameters(), lr=ctx.config.lr))
    return kwargs


def window_ids(batch: Any) -> torch.Tensor:
    """A stream batch's window indices (``stream_loader`` yields ``(windows, indices)``)."""
    return batch[1]
