"""The metrics surface with the epoch loader: ``collect_metrics`` -> ``EpochSiftingMetrics``,
log lines on the epoch logger, TensorBoard and the planner's planned steps."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from neuron_sift.integrations.schedules import ExactLengthLoader
from neuron_sift.metrics import EpochSiftingMetrics, collect_metrics, find_epoch_loader, log_metrics, write_tensorboard
from tests.neuron_sift.epoch.helpers import small_parts


def train(model, opt, loader, epochs, each=None):
    """Train ``epochs`` epochs; returns the samples the loop trained in each."""
    counted = []
    for _ in range(epochs):
        counted.append(0)
        for xb, yb in loader:
            if each is not None:
                each()
            counted[-1] += len(yb)
            loss = loader.weighted_loss(F.cross_entropy(model(xb), yb, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return counted


@pytest.fixture(scope="module")
def run():
    """The trained loader and the samples its loop trained in each of 4 epochs."""
    model, opt, loader = small_parts()
    return loader, train(model, opt, loader, 4)


@pytest.fixture(scope="module")
def trained(run):
    return run[0]


def test_metrics_surface_log_lines_and_tensorboard(run, tmp_path, caplog):
    loader, counted = run
    snap = collect_metrics(loader)
    assert isinstance(snap, EpochSiftingMetrics)
    s = snap.scalars("p/")
    assert s["p/scores_recorded"] == 256 and s["p/num_nonfinite_losses"] == 0
    assert counted == [256, 128, 128, 128]  # a full epoch, then budgets of 0.5
    observed = counted[-1] / 256  # the share the loop trained in the last epoch, counted by the loop
    assert s["p/observed_kept_share"] == observed and snap.observed_kept_share == observed
    assert "p/kept_share" not in s and not hasattr(snap, "kept_share")  # 0.5.0's alias is gone
    assert "p/epoch" in s and s["p/planning_seconds"] > 0
    kept = 1 / loader.plan.inclusion[loader.plan.order]  # the last epoch's weights: 1 / keep probability
    assert s["p/mean_weight"] == pytest.approx(float(kept.mean()), rel=1e-6) and s["p/mean_weight"] > 1
    assert s["p/max_weight"] == pytest.approx(float(kept.max()), rel=1e-6)
    assert [e["observed_kept_share"] for e in snap.epochs] == [c / 256 for c in counted]
    assert all("kept_share" not in e for e in snap.epochs)
    assert snap.as_dict()["epochs"] == snap.epochs and snap.as_dict()["scores_recorded"] == 256
    with caplog.at_level("INFO", logger="neuron_sift.epoch.loader"):
        assert isinstance(log_metrics(loader), EpochSiftingMetrics)
    assert "observed_kept_share: 0.5" in caplog.messages
    assert not any(m.startswith("kept_share") for m in caplog.messages)

    class Writer:
        calls = []

        def add_scalar(self, tag, value, step):
            self.calls.append((tag, value, step))

    write_tensorboard(loader, Writer())
    assert dict((t, v) for t, v, _ in Writer.calls) == snap.scalars("epoch_sifting/")  # the mode's prefix
    assert {step for _, _, step in Writer.calls} == {loader.counts["batches_recorded"]}
    write_tensorboard(snap, str(tmp_path), global_step=3)
    assert any(f.startswith("events") for f in os.listdir(tmp_path))
    with pytest.raises(TypeError, match="no SiftingDataloader or EpochSiftingDataloader"):
        collect_metrics([1, 2])


def test_the_epoch_loader_is_found_behind_wrappers(trained):
    class TrainerLike:
        epoch_sifting_dataloader = trained

    for wrapped in (ExactLengthLoader(trained, 3), [object(), trained], {"a": trained}, TrainerLike()):
        assert find_epoch_loader(wrapped) is trained
        assert collect_metrics(wrapped).values["scores_recorded"] == 256


def test_metrics_report_the_planners_planned_steps():
    """The metrics surface shows the batches the run still trains (what the schedule and the
    Trainer are sized by), counted here by training them: before the run and at each step."""
    model, opt, loader = small_parts(4)
    reported = [collect_metrics(loader).values["planned_steps"]]
    train(model, opt, loader, 4, each=lambda: reported.append(collect_metrics(loader).scalars()["planned_steps"]))
    steps = len(reported) - 1
    assert steps == 8 + 3 * 4
    assert reported == [steps] + list(range(steps, 0, -1))  # each read before its batch is trained
    assert collect_metrics(loader).values["planned_steps"] == 0
    no_length = EpochSiftingDataloader({}, DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=4))
    assert "planned_steps" not in collect_metrics(no_length).scalars()
