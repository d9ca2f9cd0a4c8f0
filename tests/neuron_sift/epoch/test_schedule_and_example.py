"""The epoch loader sizing a learning-rate schedule with ``planned_steps()``, and the runnable
example. (Its Trainer, Lightning and metrics tests are under tests/neuron_sift/integrations
and tests/neuron_sift/metrics.)"""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from neuron_sift.integrations.schedules import planned_steps
from tests.neuron_sift.epoch.helpers import small_parts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def small_run(epochs=4, total_from=None):
    model, opt, loader = small_parts(epochs)
    total = loader.planned_steps() if total_from is None else total_from(loader)  # exact with a budget
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / total)
    steps = 0
    for _ in range(epochs):
        for xb, yb in loader:
            loss = loader.weighted_loss(F.cross_entropy(model(xb), yb, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            steps += 1
    return loader, sched, steps


@pytest.mark.parametrize("count", ["loader", "schedules"])
def test_a_schedule_sized_by_planned_steps_ends_exactly_at_zero(count):
    """The loader's own count and ``schedules.planned_steps`` (one function for both modes) agree."""
    total_from = None if count == "loader" else (lambda loader: planned_steps(loader, None, sigmas=4.0))
    loader, sched, steps = small_run(total_from=total_from)
    assert steps == 8 + 4 + 4 + 4
    assert sched.get_last_lr()[0] == pytest.approx(0.0)


def test_the_runnable_example():
    path = os.path.join(ROOT, "examples", "epoch_sifting.py")
    spec = importlib.util.spec_from_file_location("epoch_sifting_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--epochs", "8", "--samples", "2000"]) > 0.8
