"""The scoring forward's options (``RelativeProbabilisticSiftConfig.scoring_inference_mode``,
``scoring_precision``): opt-in, scoring only, and the selection they make.

What a user relies on: the default is unchanged (no_grad, the model's precision); under the
options the model trains as before (its modes, its gradients, its precision), the losses are
ranked as float32, and a lower precision keeps nearly the same samples as full precision on
the same model (a stated tolerance: the kept sets of a batch overlap by at least 90%).
"""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.exceptions import SiftConfigValidationException
from neuron_sift.loss.abstract_sift_loss_module import Loss
from neuron_sift.scoring.forward import scoring_mode


class CrossEntropy(Loss):
    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []
        self.inference: list[bool] = []
        self.grad: list[bool] = []

    def loss(self, model, transformed_batch, original_batch):
        x, y = original_batch
        logits = model(x)
        self.dtypes.append(logits.dtype)
        self.inference.append(torch.is_inference_mode_enabled())
        self.grad.append(torch.is_grad_enabled())
        return nn.functional.cross_entropy(logits, y, reduction="none")


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))


def data(n: int = 256) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=32)


def loader(model, loss, **options):
    config = RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": 0}},
        selection_mode="fixed",
        seed=0,
        **options,
    )
    return SiftingDataloader(sift_config=config, orig_dataloader=data(), loss_impl=loss, model=model)


def kept_batches(model, **options) -> tuple[list[torch.Tensor], CrossEntropy]:
    loss = CrossEntropy()
    return [x for x, _ in loader(model, loss, **options)], loss


def test_the_default_scores_under_no_grad_in_the_models_precision():
    _, loss = kept_batches(mlp())
    assert set(loss.dtypes) == {torch.float32} and not any(loss.inference) and not any(loss.grad)


def test_inference_mode_keeps_the_same_samples_and_the_model_trains_as_before():
    model = mlp()
    model.train()
    plain, _ = kept_batches(model)
    fast, loss = kept_batches(model, scoring_inference_mode=True)
    assert all(loss.inference) and not any(loss.grad)
    assert len(plain) == len(fast) and all(torch.equal(a, b) for a, b in zip(plain, fast, strict=True))
    assert model.training and all(m.training for m in model.modules())  # modes restored
    out = model(fast[0]).sum()  # the kept batch trains with gradients, outside the scoring mode
    out.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_bfloat16_scoring_keeps_nearly_the_same_samples_and_ranks_float32_losses():
    model = mlp()
    full, _ = kept_batches(model)
    low, loss = kept_batches(model, scoring_precision="bfloat16")
    assert set(loss.dtypes) == {torch.bfloat16}  # the forward ran under autocast
    assert len(full) == len(low)  # fixed mode: the same count per source batch
    rows = lambda batches: {tuple(r.tolist()) for b in batches for r in b}  # noqa: E731
    a, b = rows(full), rows(low)
    assert len(a & b) >= 0.9 * len(a)  # the stated tolerance: at least 90% the same samples
    assert next(model.parameters()).dtype == torch.float32  # the model keeps its precision


def test_scoring_mode_restores_grad_and_autocast_state_after_an_error():
    model = mlp()
    with pytest.raises(RuntimeError, match="boom"):
        with scoring_mode(model, torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16)):
            raise RuntimeError("boom")
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize(
    ("key", "value"), [("scoring_precision", "float8"), ("scoring_precision", 16), ("scoring_inference_mode", 1)]
)
def test_bad_scoring_options_are_refused_naming_the_key(key, value):
    with pytest.raises(SiftConfigValidationException, match=key):
        RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=8, **{key: value})
