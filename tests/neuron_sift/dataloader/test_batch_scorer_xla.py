"""The per-batch loader's reference criteria and scoring model on torch-xla's CPU device:
the same selections as the eager backend, and no compilation after the first epoch (the
reference losses enter each graph as device data of the batch's padded shape)."""

import pytest
import torch

from neuron_sift import ReferenceTable, RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.backends.selections import assert_same_selections, per_epoch_ids
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader

pytestmark = pytest.mark.xla  # without torch-xla: deselected by scripts/test.sh, skipped by tests/conftest.py

try:
    import torch_xla
    import torch_xla.debug.metrics as met
except ImportError:
    torch_xla = None

N = 1000  # not a multiple of the batch size: every epoch ends with a short, padded batch


def loader(mode, criterion, device, scoring_model=None):
    g = torch.Generator().manual_seed(11)
    losses, reference = torch.rand(N, generator=g), torch.rand(N, generator=g)
    return SiftingDataloader(
        RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=64,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            selection_mode=mode,
            seed=3,
            criterion=criterion,
        ),
        loss_table_loader(losses, 32),
        loss_impl=OracleLoss(),
        model=torch.nn.Linear(1, 1).to(device),
        reference=ReferenceTable.from_losses(reference),
        scoring_model=scoring_model,
    )


def compiles() -> int:
    data = met.metric_data("CompileTime")
    return 0 if data is None else int(data[0])


@pytest.mark.parametrize("mode", ["fixed", "topk", "probabilistic"])
@pytest.mark.parametrize("criterion", ["excess", "reference"])
def test_the_reference_criteria_select_as_on_the_eager_backend(mode, criterion):
    xla = loader(mode, criterion, torch_xla.device())
    first = per_epoch_ids(xla, 1)
    before = compiles()
    got = first + per_epoch_ids(xla, 2)
    assert compiles() == before, "compiled again after the first epoch"
    compare = "fixed" if mode != "probabilistic" else mode
    assert_same_selections(got, per_epoch_ids(loader(mode, criterion, torch.device("cpu")), 3), compare)


def test_a_scoring_model_on_the_device_scores_there():
    device = torch_xla.device()
    scorer = torch.nn.Linear(1, 1).to(device)
    sl = loader("topk", "excess", device, scoring_model=scorer)
    assert sum(len(ids) for ids, _ in sl) > 0
    with pytest.raises(ValueError, match="scoring_model is on cpu"):
        loader("topk", "excess", device, scoring_model=torch.nn.Linear(1, 1))


def test_the_payback_check_is_off_on_xla_and_cuts_no_graph(caplog):
    """Timing a lazy device needs sync points the training graph does not have later: on XLA
    the check stays off (it says so once), so the first epoch's graphs are the later ones'."""
    import logging

    with caplog.at_level(logging.INFO, logger="neuron_sift"):
        sl = loader("fixed", "excess", torch_xla.device())
    assert sl.payback.done and any("payback: off on" in r.getMessage() for r in caplog.records)
    per_epoch_ids(sl, 1)
    before = compiles()
    per_epoch_ids(sl, 1)
    assert compiles() == before and sl.metrics()["payback"] is None
