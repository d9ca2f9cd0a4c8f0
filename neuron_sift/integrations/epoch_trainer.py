"""``enable_epoch_sifting``: a Hugging Face ``transformers.Trainer`` trains with epoch-level sifting.

What it does to ``trainer`` (nothing else is patched):

- ``trainer.get_train_dataloader`` is wrapped: the Trainer builds its own training loader
  as usual (column removal, collator, workers), and that loader's dataset and settings
  become the source of an ``EpochSiftingDataloader`` (the epoch plan at the sampler), seen
  by the Trainer through an ``EpochStream`` of exactly ``planned_steps() // num_train_epochs``
  batches per Trainer epoch (exact with a budget, ``kept_share``): the Trainer's
  ``max_steps`` and its learning-rate schedule then end exactly where the plan ends (the
  last ``< num_train_epochs`` batches of the plan are left out). Sifted epochs stream on
  across Trainer epochs.
- ``trainer.compute_loss`` is wrapped for training steps (model in train mode): the
  model's forward, the per-sample loss (``per_sample_loss``: ``"classification"``,
  ``"causal_lm"`` or a callable ``(outputs, inputs) -> [batch]``; default: from the labels'
  shape, 1-D classification, 2-D causal LM), then ``weighted_loss``. Evaluation keeps the
  Trainer's own loss. The Trainer's look-ahead of gradient-accumulation batches is what
  the loader's pairing expects (ids matched in the order batches were yielded).
- ``trainer.epoch_sifting_dataloader`` is the loader of the current ``train()``; with
  ``log_metrics=True`` every training log carries ``epoch_sifting/<scalar>``
  (``neuron_sift.metrics.epoch_metrics``), reaching every ``report_to`` (TensorBoard too).

Per-sample losses: classification, ``cross_entropy(logits, labels, reduction="none")``;
causal LM, the mean over each sequence's predicted tokens (labels shifted by one, -100
ignored) of the token cross-entropy.
"""

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.metrics.epoch_metrics import epoch_metrics
from neuron_sift.sift_config.epoch_config import coerce_epoch_config

logger = logging.getLogger(__name__)


class EpochStream:
    """Epochs of exactly ``per_epoch`` batches over the continuous stream of an
    ``EpochSiftingDataloader``'s epochs (a Trainer epoch may span two planned epochs)."""

    def __init__(self, loader: EpochSiftingDataloader, per_epoch: int) -> None:
        self.epoch_sifting_dataloader = loader
        self.per_epoch = max(1, int(per_epoch))
        self._it: Iterator[Any] | None = None

    def __len__(self) -> int:
        return self.per_epoch

    def __iter__(self) -> Iterator[Any]:
        n, empty = 0, 0
        while n < self.per_epoch:
            if self._it is None:
                # the Trainer may still hold batches of the previous epoch (gradient accumulation look-ahead)
                self._it = self.epoch_sifting_dataloader.iter_epoch(carry_pending=True)
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                empty += 1
                if empty > 2:
                    raise RuntimeError("EpochStream: the loader yields no batches") from None
                continue
            empty = 0
            n += 1
            yield batch


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
    if not callable(getattr(trainer, "get_train_dataloader", None)) or not hasattr(trainer, "args"):
        raise TypeError(f"trainer must be a transformers.Trainer, got {type(trainer).__name__}")
    config = coerce_epoch_config(sift_config)
    if per_sample_loss not in (None, "classification", "causal_lm") and not callable(per_sample_loss):
        raise ValueError(
            f"per_sample_loss must be 'classification', 'causal_lm', a callable or None, got {per_sample_loss!r}"
        )
    originals = getattr(trainer, "_neuron_sift_epoch_originals", None)
    if originals is None:
        originals = {
            "get_train_dataloader": trainer.get_train_dataloader,
            "compute_loss": trainer.compute_loss,
            "log": trainer.log,
        }
        trainer._neuron_sift_epoch_originals = originals
    # The loss returned is a per-batch mean: the Trainer divides it by the accumulation steps.
    trainer.model_accepts_loss_kwargs = False
    if hasattr(trainer, "loss_is_scaled_for_ga"):
        trainer.loss_is_scaled_for_ga = False

    def get_train_dataloader() -> EpochStream:
        prepared = originals["get_train_dataloader"]()
        epochs = max(1, int(round(trainer.args.num_train_epochs)))
        loader = EpochSiftingDataloader(config, prepared, num_epochs=epochs, backend=backend)
        trainer.epoch_sifting_dataloader = loader
        # The planner's count (loader.planned_steps()) is the one source of the run's length:
        # the Trainer's max_steps and schedule then end where the plans end.
        stream = EpochStream(loader, loader.planned_steps() // epochs)
        logger.info(
            "enable_epoch_sifting: %d batches per Trainer epoch (%s)",
            len(stream),
            "exact" if loader.length_is_exact else "expected",
        )
        return stream

    def compute_loss(
        model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        loader = getattr(trainer, "epoch_sifting_dataloader", None)
        if loader is None or not model.training:
            return originals["compute_loss"](
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        forward = {k: v for k, v in inputs.items() if k != "labels"}
        outputs = model(**forward)
        loss = loader.weighted_loss(_per_sample(per_sample_loss, outputs, inputs))
        return (loss, outputs) if return_outputs else loss

    def log(logs: Any, *args: Any, **kwargs: Any) -> Any:
        loader = getattr(trainer, "epoch_sifting_dataloader", None)
        if (
            log_metrics
            and loader is not None
            and isinstance(logs, dict)
            and ("loss" in logs or "train_runtime" in logs)
        ):
            logs.update(epoch_metrics(loader).scalars(prefix="epoch_sifting/"))
        return originals["log"](logs, *args, **kwargs)

    trainer.epoch_sifting_dataloader = None
    trainer.get_train_dataloader = get_train_dataloader
    trainer.compute_loss = compute_loss
    trainer.log = log
    return trainer
