"""The payback check: at warm-up the loader times its scoring against the loop's steps
and says what share of the steps selection must save, warning when that is implausible."""

import logging
import time

import torch

from neuron_sift import Loss, ReferenceTable, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.dataloader.payback import IMPLAUSIBLE_SAVING, MEASURED, WARMUP
from tests.neuron_sift.dataloader.fakes import loss_table_loader, tiny_model

STEP_S = 0.02


class SlowLoss(Loss):
    """The stored losses, after ``seconds`` of 'forward'."""

    def __init__(self, seconds):
        self.seconds = seconds

    def loss(self, model, transformed_batch, original_batch=None):
        time.sleep(self.seconds)
        return original_batch[1].float()


def run(loader):
    for _ in loader:
        time.sleep(STEP_S)  # the loop's training step


def config(criterion="loss"):
    return RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": 2}},
        selection_mode="fixed",
        seed=0,
        criterion=criterion,
    )


def test_a_scorer_as_costly_as_the_step_is_warned_about(caplog):
    n = 16 * 2 * (WARMUP + MEASURED + 4)
    loader = SiftingDataloader(
        config(), loss_table_loader(torch.rand(n), 16), loss_impl=SlowLoss(STEP_S), model=tiny_model()
    )
    with caplog.at_level(logging.INFO, logger="neuron_sift"):
        run(loader)
    report = loader.metrics()["payback"]
    assert report is not None and 0.5 < report["forward_share"] < 2.0
    # kept share 1/2: a trained batch costs 1 + forward / 0.5 steps
    assert abs(report["cost_per_trained_batch"] - (1 + report["forward_share"] / 0.5)) < 1e-9
    assert report["break_even_saving"] > IMPLAUSIBLE_SAVING
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "payback" in r.getMessage()]
    assert len(warnings) == 1 and "scoring_model=" in warnings[0].getMessage()
    assert sum("payback: scoring a source batch costs" in r.getMessage() for r in caplog.records) == 1


def test_a_scorer_that_costs_nothing_is_not_warned_about(caplog):
    n = 16 * 2 * (WARMUP + MEASURED + 4)
    loader = SiftingDataloader(
        config("reference"),
        loss_table_loader(torch.rand(n), 16),
        loss_impl=SlowLoss(1.0),
        model=tiny_model(),
        reference=ReferenceTable.from_losses(torch.rand(n)),
    )
    with caplog.at_level(logging.INFO, logger="neuron_sift"):
        run(loader)
    report = loader.metrics()["payback"]
    assert report is not None and report["forward_share"] < 0.2 and report["break_even_saving"] < IMPLAUSIBLE_SAVING
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_no_report_before_enough_steps():
    loader = SiftingDataloader(
        config(), loss_table_loader(torch.rand(64), 16), loss_impl=SlowLoss(0.0), model=tiny_model()
    )
    run(loader)
    assert loader.metrics()["payback"] is None


def test_it_measures_only_within_the_first_pass():
    """A device that compiles a graph per sync point must meet none of the check's after its
    first epoch: the check stops at the end of the first pass, reporting what it measured."""
    loader = SiftingDataloader(
        config(), loss_table_loader(torch.rand(16 * 8), 16), loss_impl=SlowLoss(0.0), model=tiny_model()
    )
    run(loader)  # 8 source batches: 2 delayed, 6 scored, fewer than WARMUP + MEASURED of each
    first = loader.metrics()["payback"]
    measured = (len(loader.payback.scoring), len(loader.payback.steps))
    assert first is not None and measured[0] < WARMUP + MEASURED
    run(loader)
    assert loader.metrics()["payback"] == first
    assert (len(loader.payback.scoring), len(loader.payback.steps)) == measured


class SlowModelLoss(SlowLoss):
    """SlowLoss through the model's weights (zero times them): a scoring model can step on it."""

    def loss(self, model, transformed_batch, original_batch=None):
        return super().loss(model, transformed_batch, original_batch) + 0.0 * next(model.parameters()).sum()


def test_a_trained_scoring_model_counts_its_own_step():
    n = 16 * 2 * (WARMUP + MEASURED + 4)
    scorer = tiny_model()
    loader = SiftingDataloader(
        config(),
        loss_table_loader(torch.rand(n), 16),
        loss_impl=SlowModelLoss(STEP_S),
        model=tiny_model(),
        scoring_model=scorer,
        scoring_optimizer=torch.optim.SGD(scorer.parameters(), lr=0.1),
    )
    run(loader)
    report = loader.metrics()["payback"]
    # its step calls the same loss (STEP_S) on a kept batch: about one training step
    assert report is not None and 0.5 < report["learn_share"] < 2.0
    assert abs(report["cost_per_trained_batch"] - (1 + report["forward_share"] / 0.5 + report["learn_share"])) < 1e-9
