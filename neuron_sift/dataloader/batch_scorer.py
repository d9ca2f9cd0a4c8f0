"""What scores a source batch for the per-batch loader: which model runs the no-grad
forward, and what the selection ranks (the config's ``criterion``).

Why apart from the pass: the scorer is the cost per-batch sifting pays for every source
batch, and the choices that make it cheaper belong together. The model's own forward
(smart_sifting's rule, ``criterion="loss"``) costs about a third of a training step per
source batch; a scoring model of the user's (smaller than the trained one, optionally
trained here on the batches the loader yields, one step of its own optimizer per yielded
batch) costs what it costs; a reference table (``scoring/reference_table.py``) read by
sample id costs nothing on the device. ``excess`` ranks the scoring forward's loss minus
the reference loss (RHO-LOSS's reducible loss: learnable, worth learning, not yet
learned); ``reference`` ranks minus the reference loss alone, with no forward: the static
filter any online rule must beat.

Rows the backend padded (a short last batch on XLA) get reference 0: they are masked out
by the step whatever they score.
"""

from collections.abc import Callable
from typing import Any

import torch

from neuron_sift.backends.base import Backend, model_device
from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.dataloader.sample_ids import SampleIds
from neuron_sift.scoring.forward import SCORING_DTYPES, check_losses, scoring_mode
from neuron_sift.scoring.reference_table import ReferenceTable
from neuron_sift.sift_config.sift_configs import RelativeProbabilisticSiftConfig


class BatchScorer:
    """Scores the loader's source batches by its config's criterion. ``model``: the trained
    model; ``scoring_model``/``scoring_optimizer``: the cheaper scorer and, when given, its
    own training on the yielded batches; ``reference``/``ids``: the reference table and
    where each batch's sample ids come from (both None unless the criterion needs them)."""

    def __init__(
        self,
        config: RelativeProbabilisticSiftConfig,
        model: torch.nn.Module,
        loss_fn: Callable[..., Any],
        backend: Backend,
        scoring_model: torch.nn.Module | None,
        scoring_optimizer: torch.optim.Optimizer | None,
        reference: ReferenceTable | None,
        ids: SampleIds | None,
    ) -> None:
        self.config = config
        self.loss_fn = loss_fn
        self.backend = backend
        self.model = model if scoring_model is None else scoring_model
        self.scoring_optimizer = scoring_optimizer
        self.reference = reference
        self.ids = ids
        check_scorer(config, backend, scoring_model, scoring_optimizer, reference)
        if reference is not None and ids is not None and ids.dataset is not None:
            reference.check_dataset(ids.dataset, who="SiftingDataloader")

    @property
    def forward_free(self) -> bool:
        """Whether scoring runs no forward at all (the static reference filter)."""
        return self.config.criterion == "reference"

    def score(self, scored: SiftingBatch, original: Any, ids: torch.Tensor | None) -> torch.Tensor:
        """One value per row of ``scored`` (padded rows included), on the backend's device:
        the higher, the likelier kept."""
        rows = len(scored)
        reference = None
        if self.reference is not None:
            assert ids is not None  # the loader reads ids whenever it has a reference
            values = self.reference.lookup(ids)
            if values.shape[0] < rows:
                values = torch.cat([values, values.new_zeros(rows - values.shape[0])])
            reference = values.to(self.backend.device)
        if self.forward_free:
            assert reference is not None
            return -reference
        config = self.config
        precision = config.scoring_precision
        autocast = None if precision == "model" else self.backend.autocast(SCORING_DTYPES[precision])
        inference = self.backend.inference_mode() if config.scoring_inference_mode else None
        with scoring_mode(self.model, inference, autocast):
            losses = self.loss_fn(self.model, scored, original)
        losses = check_losses(losses, rows, self.backend)
        return losses if reference is None else losses - reference.to(losses.dtype)

    def learn(self, batch: SiftingBatch, out_batch: Any) -> None:
        """One step of the scoring model's optimizer on a batch the loader yields (when it
        has one): the mean of the loss the scorer ranks with, in train mode."""
        if self.scoring_optimizer is None:
            return
        model = self.model
        was_training = model.training
        model.train()
        try:
            with torch.enable_grad():
                losses = self.loss_fn(model, batch, out_batch)
                check_losses(losses.detach(), len(batch), self.backend)
                self.scoring_optimizer.zero_grad(set_to_none=True)
                losses.float().mean().backward()
                self.scoring_optimizer.step()
        finally:
            model.train(was_training)


def check_scorer(
    config: RelativeProbabilisticSiftConfig,
    backend: Backend,
    scoring_model: Any,
    scoring_optimizer: Any,
    reference: ReferenceTable | None,
) -> None:
    """Refuse a combination that would score otherwise than the user asked."""
    if scoring_model is not None:
        if not isinstance(scoring_model, torch.nn.Module):
            raise TypeError(f"scoring_model must be a torch.nn.Module, got {type(scoring_model).__name__}")
        device = model_device(scoring_model)
        if not backend.same_device(device, backend.device):
            raise ValueError(
                f"scoring_model is on {device} but the model is on {backend.device}: the scoring forward's losses "
                "select the model's samples on its device; move the scoring model there"
            )
        if config.criterion == "reference":
            raise ValueError("scoring_model is not used with criterion='reference' (no scoring forward); drop it")
    if scoring_optimizer is not None:
        if scoring_model is None:
            raise ValueError("scoring_optimizer trains the scoring_model: give scoring_model too")
        if not isinstance(scoring_optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"scoring_optimizer must be a torch.optim.Optimizer, got {type(scoring_optimizer).__name__}"
            )
    if config.uses_reference and reference is None:
        raise ValueError(
            f"criterion={config.criterion!r} needs a reference table: pass reference= (a ReferenceTable or a folder "
            "written by neuron_sift.score_dataset)"
        )
    if reference is not None and not config.uses_reference:
        raise ValueError(
            "reference= is given but the criterion is 'loss', which does not read it: set criterion='excess' "
            "(loss minus reference) or 'reference' (the reference alone)"
        )
