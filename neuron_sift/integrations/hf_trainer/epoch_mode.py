"""``enable_epoch_sifting``: a Hugging Face ``transformers.Trainer`` trains with epoch-level sifting.

Imported from ``neuron_sift.integrations.epoch_trainer``. What it does to ``trainer``
(nothing else is patched; the patch is one mode's hook set of ``hf_trainer.patch``, so it
replaces an earlier ``enable_sifting`` or ``enable_epoch_sifting``):

- ``trainer.get_train_dataloader`` is wrapped: the Trainer builds its own training loader
  as usual (column removal, collator, workers), and that loader's dataset and settings
  become the source of an ``EpochSiftingDataloader`` (the epoch plan at the sampler), seen
  by the Trainer through an ``ExactLengthLoader`` of exactly ``planned_steps() // num_train_epochs``
  batches per Trainer epoch (exact with a budget, ``kept_share``): the Trainer's
  ``max_steps`` and its learning-rate schedule then end exactly where the plan ends (the
  last ``< num_train_epochs`` batches of the plan are left out). Sifted epochs stream on
  across Trainer epochs.
- ``trainer.compute_loss`` is wrapped for training steps (model in train mode): the
  model's forward, the per-sample loss (``per_sample_loss``: ``"classification"``,
  ``"causal_lm"`` or a callable ``(outputs, inputs) -> [batch]``; default: from the labels'
  shape, 1-D classification, 2-D causal LM), then ``weighted_loss``. Evaluation keeps the
  Trainer's own loss. The Trainer pulls one optimizer step's ``gradient_accumulation_steps``
  batches before their losses: the loader is given that look-ahead (``lookahead``), so a
  batch passed over is caught at once, and the pairing matches ids in the order batches
  were yielded.
- ``trainer.epoch_sifting_dataloader`` is the loader of the current ``train()``
  (``trainer.epoch_sifting_stream`` the ``ExactLengthLoader``); with ``log_metrics=True``
  every training log carries ``epoch_sifting/<scalar>`` (``neuron_sift.metrics.collect_metrics``),
  reaching every ``report_to`` (TensorBoard too).
- The run's length is the plan's (``hf_trainer.run_length``): ``num_train_epochs`` must be a whole
  number >= 1; a ``max_steps`` beyond the plan's optimizer steps is refused, one inside it
  stops the Trainer there (with a warning naming what is left out).
- The data-parallel world is the Trainer's (``hf_trainer.ranks``): where the Trainer trains
  each process on its own although ``torch.distributed`` has several ranks (accelerate's
  ``DistributedType.NO`` under ``torchrun``), every process plans and trains the whole
  epoch, as the Trainer does without sifting; where it shards the data, the plan is
  sharded over the same ranks; a disagreement is refused naming both.
- Checkpoints (``hf_trainer.checkpoint``): a ``TrainerCallback`` writes the stream's
  ``state_dict()`` into each checkpoint folder the Trainer saves (``state_file(process)``), and
  ``trainer.train`` is wrapped so that ``resume_from_checkpoint`` restores it into the new
  stream, from an epoch's end or from its middle (the Trainer's skip of the epoch's trained
  batches is answered by the stream's own state). Checkpoints of 0.4.0 (its
  ``EpochStream`` state) still resume.

Per-sample losses: classification, ``cross_entropy(logits, labels, reduction="none")``;
causal LM, the mean over each sequence's predicted tokens (labels shifted by one, -100
ignored) of the token cross-entropy.
"""

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.integrations.exact_length import ExactLengthLoader
from neuron_sift.integrations.hf_trainer.checkpoint import TrainerCheckpoints
from neuron_sift.integrations.hf_trainer.checkpoint import state_file as checkpoint_state_file
from neuron_sift.integrations.hf_trainer.optimizer import check_trainer_optimizer
from neuron_sift.integrations.hf_trainer.patch import HookSet, install, log_hook, original, require_trainer
from neuron_sift.integrations.hf_trainer.ranks import trainer_distributed
from neuron_sift.integrations.hf_trainer.run_length import check_max_steps, check_within_plan, planned_epochs
from neuron_sift.sift_config.epoch_config import coerce_epoch_config

logger = logging.getLogger(
    "neuron_sift.integrations.epoch_trainer"
)  # its name before the room: users' logging settings hold


def per_sample_classification(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="none")


def per_sample_causal_lm(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean token cross-entropy of each sequence (next-token prediction, ``ignore_index`` skipped)."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    tok = F.cross_entropy(shift_logits.transpose(1, 2), shift_labels, reduction="none", ignore_index=ignore_index)
    valid = (shift_labels != ignore_index).to(tok.dtype)
    return (tok * valid).sum(1) / valid.sum(1).clamp(min=1.0)


def _per_sample(kind: str | Callable[..., torch.Tensor] | None, outputs: Any, inputs: dict[str, Any]) -> torch.Tensor:
    labels: Any = inputs.get("labels")
    if callable(kind):
        return kind(outputs, inputs)
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
    if kind is None:
        kind = "causal_lm" if labels is not None and labels.dim() == 2 else "classification"
    if kind == "classification":
        return per_sample_classification(logits, labels)
    if kind == "causal_lm":
        return per_sample_causal_lm(logits, labels)
    raise ValueError(f"per_sample_loss must be 'classification', 'causal_lm', a callable or None, got {kind!r}")


def enable_epoch_sifting(
    trainer: Any,
    sift_config: Any,
    per_sample_loss: str | Callable[..., torch.Tensor] | None = None,
    *,
    backend: str | None = None,
    log_metrics: bool = True,
) -> Any:
    """Make ``trainer`` train with epoch-level sifting (see the module docstring); returns it."""
    require_trainer(trainer)
    check_trainer_optimizer(trainer, "enable_epoch_sifting")
    config = coerce_epoch_config(sift_config)
    if per_sample_loss not in (None, "classification", "causal_lm") and not callable(per_sample_loss):
        raise ValueError(
            f"per_sample_loss must be 'classification', 'causal_lm', a callable or None, got {per_sample_loss!r}"
        )
    planned_epochs(trainer.args.num_train_epochs)  # fail now, not at train()
    checkpoints = TrainerCheckpoints(trainer, "epoch_sifting", "epoch_sifting_stream")

    def get_train_dataloader() -> ExactLengthLoader:
        args = trainer.args
        epochs = planned_epochs(args.num_train_epochs)
        prepared = original(trainer, "get_train_dataloader")()
        distributed = trainer_distributed(trainer, prepared)
        # The Trainer pulls one optimizer step's batches before their losses: its look-ahead.
        accumulation = int(args.gradient_accumulation_steps)
        loader = EpochSiftingDataloader(
            config, prepared, num_epochs=epochs, backend=backend, distributed=distributed, lookahead=accumulation
        )
        trainer.epoch_sifting_dataloader = loader
        # The planner's count is the one source of the run's length: the Trainer's max_steps
        # and schedule then end where the plans end.
        stream = ExactLengthLoader(loader, epochs=epochs)
        stops_early = check_max_steps(args.max_steps, stream.steps_per_epoch, epochs, accumulation)
        if stops_early is not None:
            logger.warning("enable_epoch_sifting: %s", stops_early)
        checkpoints.restore_into(stream)
        trainer.epoch_sifting_stream = stream
        logger.info(
            "enable_epoch_sifting: %d batches per Trainer epoch (%s)",
            len(stream),
            "exact" if loader.length_is_exact else "expected",
        )
        return stream

    def compute_loss(model: Any, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any) -> Any:
        # kwargs: what the Trainer passed, forwarded as is. Evaluation passes no num_items_in_batch,
        # and a subclass's compute_loss written before transformers 4.46 takes none.
        loader = getattr(trainer, "epoch_sifting_dataloader", None)
        if loader is None or not model.training:
            return original(trainer, "compute_loss")(model, inputs, return_outputs=return_outputs, **kwargs)
        check_within_plan(loader)
        forward = {k: v for k, v in inputs.items() if k != "labels"}
        outputs = model(**forward)
        loss = loader.weighted_loss(_per_sample(per_sample_loss, outputs, inputs))
        return (loss, outputs) if return_outputs else loss

    # The loss returned is a per-batch mean: the Trainer must not divide it by the accumulation steps.
    attributes: dict[str, Any] = {
        "epoch_sifting_dataloader": None,
        "epoch_sifting_stream": None,
        "model_accepts_loss_kwargs": False,
    }
    if hasattr(trainer, "loss_is_scaled_for_ga"):
        attributes["loss_is_scaled_for_ga"] = False
    hooks = HookSet(
        "epoch_sifting",
        {
            "get_train_dataloader": get_train_dataloader,
            "compute_loss": compute_loss,
            "log": log_hook(trainer, "epoch_sifting_dataloader", "epoch_sifting/", log_metrics),
            **checkpoints.methods(),
        },
        attributes=attributes,
        callbacks=[checkpoints.callback()],
    )
    return install(trainer, hooks)


def state_file(rank: int) -> str:
    """The file in a Trainer checkpoint folder holding this process's epoch-sifting state."""
    return checkpoint_state_file("epoch_sifting", rank)
