"""``TracedLoss`` (opt-in): the scoring forward traced once on torch-xla, identical
selections, and a clear refusal where the loss cannot be traced that way."""

import pytest
import torch

try:  # without torch-xla these tests are deselected by scripts/test.sh, skipped by tests/conftest.py
    import torch_xla

    from tests.neuron_sift.backends.xla_probe import CELoss  # the probe's loss, the same user code
except ImportError:
    torch_xla = None

from neuron_sift import (  # noqa: E402
    LossOutputException,
    RelativeProbabilisticSiftConfig,
    SiftingDataloader,
    TracedLoss,  # noqa: E402
)
from tests.neuron_sift.backends.test_xla_backend import classification_data  # noqa: E402
from tests.neuron_sift.dataloader.fakes import Classifier  # noqa: E402

pytestmark = pytest.mark.xla


def train(loss_impl, mode, epochs=2):
    """Sifted training on XLA; the weights change every step, so a loss that captured them
    at trace time would select differently from the second batch on."""
    torch.manual_seed(0)
    device = torch_xla.device()
    model = Classifier().to(device)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=128,
            selection_mode=mode,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            seed=0,
        ),
        orig_dataloader=torch.utils.data.DataLoader(classification_data(600), batch_size=64),  # 600 % 64 = 24
        loss_impl=loss_impl,
        model=model,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for _ in range(epochs):
        for x, y in loader:
            kept.append(torch.cat([x[:, 0], y.float()]).cpu())
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch_xla.sync()
    return kept


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
def test_traced_scoring_selects_exactly_what_the_plain_loss_selects(mode):
    traced = TracedLoss(CELoss())
    a = train(traced, mode)
    b = train(CELoss(), mode)
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(traced._pure) == 1  # one trace: the short last batch is padded to the same shape


class ReadsTheHost:
    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        out = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        return out * float(out.max().item() > 0)


class BranchesOnAValue:
    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        out = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        return out if out.mean() > 0.5 else out * 2


@pytest.mark.parametrize("loss", [ReadsTheHost(), BranchesOnAValue()], ids=["item", "branch"])
def test_a_loss_that_cannot_be_traced_is_refused_with_the_reason(loss):
    with pytest.raises(LossOutputException, match="cannot be traced as a pure function"):
        train(TracedLoss(loss), "fixed", epochs=1)


def test_refused_off_xla():
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0, loss_history_length=16, loss_based_sift_config={"sift_config": {"sift_delay": 0}}
        ),
        orig_dataloader=torch.utils.data.DataLoader(classification_data(64), batch_size=16),
        loss_impl=TracedLoss(CELoss()),
        model=Classifier(),
    )
    with pytest.raises(LossOutputException, match="needs the model and the batch on an XLA device"):
        list(loader)
