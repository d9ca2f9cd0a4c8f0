"""``enable_sifting``: make a Hugging Face ``transformers.Trainer`` train on sifted batches.

smart_sifting's ``integrations.trainer.enable_sifting(trainer, sift_config, loss,
set_epochs=None)``, with the same call, imported from that path
(``neuron_sift.integrations.trainer``). What it does to ``trainer``:

- ``trainer.get_train_dataloader`` is wrapped: the Trainer first builds its own training
  DataLoader as usual (its sampler, collator, ``accelerator.prepare``: device placement,
  per-rank sharding, or ``MpDeviceLoader`` on XLA), then that loader becomes the source of
  a ``SiftingDataloader`` scoring with ``trainer.model``, wrapped in an
  ``ExactLengthLoader``. Evaluation and prediction loaders are not touched.
- The Trainer plans ``max_steps`` from ``len(train_dataloader) * num_train_epochs``. The
  ``ExactLengthLoader`` makes that length exact: each Trainer epoch is exactly
  ``len(train_dataloader)`` sifted batches (the planned batches of ``num_train_epochs``
  passes over the data, divided by ``num_train_epochs``), continuing into the next pass
  where a pass is longer or shorter. So the Trainer runs exactly the optimizer steps it
  planned, its learning-rate schedule ends exactly at its end, no Trainer epoch stops a
  pass half-way, and every data-parallel rank (planning the same length) runs the same
  number of steps even in ``probabilistic`` mode. The run takes ``num_train_epochs *
  len()`` batches, within ``num_train_epochs / 2`` of the planned batches of
  ``num_train_epochs`` passes.
- The ranks the loader coordinates over are the Trainer's data-parallel ranks
  (``hf_trainer.ranks``): where the Trainer trains each process on its own although
  ``torch.distributed`` has several ranks (accelerate's ``DistributedType.NO`` under
  ``torchrun``), each process sifts as a one-process run would (the same draws in every
  process, as the Trainer trains without sifting); where it shards the data, the ranks
  agree on their steps; a disagreement between the two is refused naming both.
- ``trainer.sifting_dataloader`` is the ``SiftingDataloader`` of the current ``train()``
  (None before), for ``counts``, ``metrics()`` and ``neuron_sift.metrics.collect_metrics``;
  ``trainer.sifting_stream`` is the ``ExactLengthLoader`` around it that the Trainer trains
  from (None for a dataset without a length).
- With ``log_metrics=True`` (default), every training log of the Trainer (each
  ``logging_steps`` and the final one) also carries the sifting scalars as
  ``sifting/<name>`` (see ``SiftingMetrics.scalars``): they reach ``state.log_history`` and
  every ``report_to`` integration (TensorBoard included).

``set_epochs`` (smart_sifting: without a length the Trainer demanded ``max_steps``; with
``set_epochs`` it trained for ``num_train_epochs``):

- ``None`` or ``False``: the Trainer's arguments decide. ``max_steps > 0`` trains that many
  optimizer steps (the sifted stream continues over as many passes as needed); otherwise
  it trains ``num_train_epochs`` epochs, since the sifted loader has a length.
- ``True``: train ``args.num_train_epochs`` epochs; a ``max_steps`` set in the arguments is
  reset to -1 (ignored).
- an int ``n >= 1``: ``args.num_train_epochs = n``, and ``max_steps`` is ignored as above.

Checkpoints (``hf_trainer.checkpoint``): every checkpoint the Trainer saves gets the stream's
state (``sifting_rank<process>.pt``), and ``train(resume_from_checkpoint=...)`` restores it,
from an epoch's end or from its middle (the Trainer's skip of the epoch's trained batches
is answered by the stream's own state). A dataset without a length has no stream to
restore: resuming its run is refused.
"""

import logging
import math
import numbers
from typing import Any

from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
from neuron_sift.integrations.hf_trainer.checkpoint import TrainerCheckpoints
from neuron_sift.integrations.hf_trainer.optimizer import check_trainer_optimizer
from neuron_sift.integrations.hf_trainer.patch import HookSet, install, log_hook, original, require_trainer
from neuron_sift.integrations.hf_trainer.ranks import trainer_distributed
from neuron_sift.integrations.schedules import ExactLengthLoader, batches_per_epoch, round_half_up
from neuron_sift.loss.abstract_sift_loss_module import resolve_loss_fn
from neuron_sift.shared.sources import batch_settings, underlying_dataloader
from neuron_sift.sift_config.sift_configs import coerce_sift_config

logger = logging.getLogger("neuron_sift.integrations.trainer")  # its name before the room: users' logging settings hold

_MAX_PLANNED_PASSES = 10_000


def _check_set_epochs(set_epochs: Any) -> int | None:
    """None (arguments decide), 0 meaning 'the arguments' num_train_epochs', or n >= 1."""
    if set_epochs is None or set_epochs is False:
        return None
    if set_epochs is True:
        return 0
    # int(): numbers.Integral's stubs declare no >= (concrete integer types all have it)
    if isinstance(set_epochs, numbers.Integral) and int(set_epochs) >= 1:
        return int(set_epochs)
    raise ValueError(f"set_epochs must be None, a bool or an int >= 1, got {set_epochs!r}")


class _Sized:
    """A stand-in sampler that only has a length (what the loader plans with)."""

    def __init__(self, n: int):
        self._n = n

    def __len__(self) -> int:
        return self._n


class TrainerSource:
    """The Trainer's prepared train loader, with the batch size and sample count to plan with.

    ``accelerator.prepare`` returns a ``DataLoaderShard`` (an adapter built from a batch
    sampler, so its ``batch_size`` is None), or on XLA an ``MpDeviceLoaderWrapper`` around
    one. Iteration, ``len()`` and ``set_epoch`` go to the prepared loader unchanged; this
    object only adds, from its batch sampler, the per-process batch size, the number of
    samples per process (every batch full when sharded over several processes, as
    accelerate's default ``even_batches`` makes them) and ``drop_last``.
    """

    def __init__(self, prepared: Any):
        self.prepared = prepared
        inner = underlying_dataloader(prepared)
        settings = batch_settings(inner)
        batch_sampler = settings.batch_sampler
        b = settings.batch_size
        processes = int(getattr(batch_sampler, "num_processes", 1) or 1)
        if getattr(batch_sampler, "split_batches", False) and b:
            b //= processes
        if not isinstance(b, int) or b < 1:
            raise TypeError("the Trainer's train loader has no batch size")
        n_batches = len(prepared)
        if processes > 1:
            n_samples = n_batches * b
            drop_last = True
        else:
            sampler = settings.sampler if settings.sampler is not None else getattr(inner, "sampler", None)
            if sampler is None:  # TypeError, as len(None) raised: the caller reads it as "no length"
                raise TypeError("the Trainer's train loader has no sampler")
            n_samples = len(sampler)
            drop_last = settings.drop_last
        self.batch_size = b
        self.sampler = _Sized(n_samples)
        self.drop_last = drop_last
        self.dataset = getattr(inner, "dataset", None)

    def __len__(self) -> int:
        return len(self.prepared)

    def __iter__(self):
        return iter(self.prepared)

    def set_epoch(self, epoch: int) -> None:
        if callable(getattr(self.prepared, "set_epoch", None)):
            self.prepared.set_epoch(epoch)


def steps_per_epoch_for(args: Any, sifting: SiftingDataloader) -> int:
    """Batches per Trainer epoch: the planned batches per pass over the data.

    Averaged over ``ceil(num_train_epochs)`` passes, or, with ``max_steps > 0``, over the
    passes that ``max_steps * gradient_accumulation_steps`` batches take.
    """
    if args.max_steps is not None and args.max_steps > 0:
        needed = args.max_steps * max(int(args.gradient_accumulation_steps), 1)
        passes = 1
        while True:
            plan = batches_per_epoch(sifting, passes)
            if sum(plan) >= needed or passes >= _MAX_PLANNED_PASSES:
                break
            passes = min(passes * 2, _MAX_PLANNED_PASSES)
        total = sum(plan)
    else:
        passes = max(1, math.ceil(args.num_train_epochs))
        total = sum(batches_per_epoch(sifting, passes))
    return max(1, round_half_up(total / passes))


def enable_sifting(
    trainer: Any,
    sift_config: Any,
    loss: Any,
    set_epochs: Any = None,
    *,
    batch_transforms: Any = None,
    log_batch_data: bool = False,
    batch_format_index: int | None = None,
    backend: str | None = None,
    log_metrics: bool = True,
) -> Any:
    """Make ``trainer`` (a ``transformers.Trainer``) train on sifted batches; returns ``trainer``.

    ``sift_config``: a ``RelativeProbabilisticSiftConfig`` or dict. ``loss``: a ``Loss``
    scoring the Trainer's own batches (dicts of tensors, already on the Trainer's device)
    with ``loss(model, transformed_batch, original_batch)`` -> one loss per sample.
    ``set_epochs``: see the module docstring. The keyword-only arguments are passed to
    ``SiftingDataloader``; ``log_metrics`` adds the sifting scalars to the Trainer's logs.
    Calling it again on the same trainer replaces the previous settings, and so does a later
    ``enable_epoch_sifting`` (one patcher, ``hf_trainer.patch``: one mode at a time).
    """
    require_trainer(trainer)
    check_trainer_optimizer(trainer, "enable_sifting")
    config = coerce_sift_config(sift_config)
    resolve_loss_fn(loss)  # fail now, not at the first training step
    epochs = _check_set_epochs(set_epochs)
    args = trainer.args
    if epochs is not None:
        if epochs >= 1:
            args.num_train_epochs = epochs
        if args.max_steps is not None and args.max_steps > 0:
            logger.info(
                "enable_sifting(set_epochs=%r): training %s epochs; max_steps=%d is ignored",
                set_epochs,
                args.num_train_epochs,
                args.max_steps,
            )
            args.max_steps = -1
    checkpoints = TrainerCheckpoints(trainer, "sifting", "sifting_stream")

    def get_train_dataloader():
        prepared = original(trainer, "get_train_dataloader")()
        distributed = trainer_distributed(trainer, prepared)
        try:
            source = TrainerSource(prepared)
        except TypeError:  # no length (an IterableDataset): the Trainer then needs max_steps
            source = None
        sifting = SiftingDataloader(
            sift_config=config,
            orig_dataloader=prepared if source is None else source,
            batch_transforms=batch_transforms,
            loss_impl=loss,
            model=trainer.model,
            log_batch_data=log_batch_data,
            batch_format_index=batch_format_index,
            backend=backend,
            distributed=distributed,
        )
        trainer.sifting_dataloader = sifting
        if source is None:
            if checkpoints.folder is not None:
                raise ValueError(
                    "enable_sifting resumes a checkpoint through the sifted stream of a train dataset with a length; "
                    "this train dataset has none. Train without resume_from_checkpoint, or give the dataset a length"
                )
            logger.info("enable_sifting: the train dataset has no length; the Trainer needs max_steps")
            return sifting
        loader = ExactLengthLoader(sifting, steps_per_epoch_for(trainer.args, sifting))
        checkpoints.restore_into(loader)
        trainer.sifting_stream = loader
        logger.info(
            "enable_sifting: %d sifted batches per epoch (%s, %s mode)",
            len(loader),
            "exact" if sifting.length_is_exact else "expected",
            sifting.selection_mode,
        )
        return loader

    hooks = HookSet(
        "sifting",
        {
            "get_train_dataloader": get_train_dataloader,
            "log": log_hook(trainer, "sifting_dataloader", "sifting/", log_metrics),
            **checkpoints.methods(),
        },
        attributes={"sifting_dataloader": None, "sifting_stream": None},
        callbacks=[checkpoints.callback()],
    )
    return install(trainer, hooks)
