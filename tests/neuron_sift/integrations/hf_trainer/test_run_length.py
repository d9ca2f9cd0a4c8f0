"""``enable_epoch_sifting`` runs as long as its plan: a fractional ``num_train_epochs`` and a
``max_steps`` beyond the plan are refused, a ``max_steps`` inside it stops there with a
warning, and a Trainer that still starts an unplanned epoch is stopped."""

import logging
import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting
from neuron_sift.integrations.hf_trainer.run_length import (
    check_max_steps,
    check_within_plan,
    plan_optimizer_steps,
    planned_epochs,
)
from tests.neuron_sift.integrations.hf_trainer.fake_trainer import FakeTrainer, train_loader
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import scenarios

# 32 samples, batch 4, 4 epochs: plans of 8, 4, 4 and 8 batches, 6 per Trainer epoch, 24 steps.
EPOCH_CONFIG = {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.25, "start_rank_correlation": None}  # exact


@pytest.mark.parametrize("epochs, planned", [(4, 4), (4.0, 4), (1.0, 1)])
def test_whole_epochs_are_planned(epochs, planned):
    assert planned_epochs(epochs) == planned


@pytest.mark.parametrize(
    "epochs, suggestion",
    [(2.5, r"got 2\.5: .* \(2 or 3\)"), (0.5, r"got 0\.5: .* \(1\)"), (0, "got 0"), (-1.0, "got -1.0"),
     (math.nan, "got nan"), (math.inf, "got inf"), (True, "got True"), ("3", "got '3'")],
)  # fmt: skip
def test_other_epoch_counts_are_refused_saying_what_to_set(epochs, suggestion):
    with pytest.raises(ValueError, match=f"num_train_epochs must be a whole number >= 1, {suggestion}"):
        planned_epochs(epochs)


def test_the_plans_optimizer_steps_count_a_short_last_accumulation():
    assert plan_optimizer_steps(6, 4, 1) == 24
    assert plan_optimizer_steps(9, 4, 2) == 20  # 2 + 2 + 2 + 2 + 1 batches per epoch, as the Trainer steps
    assert plan_optimizer_steps(1, 3, 4) == 3


def test_max_steps_against_the_plan():
    assert check_max_steps(-1, 6, 4, 1) is None  # the plan decides
    assert check_max_steps(24, 6, 4, 1) is None  # exactly the plan
    assert "stops after 10 of the 24 optimizer steps" in check_max_steps(10, 6, 4, 1)
    with pytest.raises(ValueError, match="max_steps=25 asks for more optimizer steps than the epoch-sifting plan"):
        check_max_steps(25, 6, 4, 1)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2\) are 12 optimizer steps"):
        check_max_steps(13, 6, 4, 2)


def test_a_fractional_num_train_epochs_is_refused_at_the_call_and_at_train():
    with pytest.raises(ValueError, match="num_train_epochs must be a whole number >= 1, got 2.5"):
        enable_epoch_sifting(FakeTrainer(train_loader(), num_train_epochs=2.5), EPOCH_CONFIG)
    trainer = enable_epoch_sifting(FakeTrainer(train_loader()), EPOCH_CONFIG)
    trainer.args.num_train_epochs = 2.5  # changed after enabling: refused when train() asks for the loader
    with pytest.raises(ValueError, match="got 2.5"):
        trainer.get_train_dataloader()


def test_max_steps_beyond_the_plan_is_refused_when_train_asks_for_the_loader():
    trainer = enable_epoch_sifting(FakeTrainer(train_loader(), max_steps=25), EPOCH_CONFIG)
    with pytest.raises(ValueError, match="num_train_epochs=4 epochs of 6 batches .* are 24 optimizer steps"):
        trainer.get_train_dataloader()


def test_max_steps_inside_the_plan_is_warned(caplog):
    trainer = enable_epoch_sifting(FakeTrainer(train_loader(), max_steps=10), EPOCH_CONFIG)
    with caplog.at_level(logging.WARNING, logger="neuron_sift.integrations.epoch_trainer"):
        assert len(trainer.get_train_dataloader()) == 6
    assert any("stops after 10 of the 24 optimizer steps" in m for m in caplog.messages)


def test_an_epoch_past_an_exact_plan_stops_the_trainer():
    """A Trainer that counts its steps otherwise (transformers 4 rounds each epoch's optimizer
    steps down) and iterates a Trainer epoch more than planned: its first training step
    there is refused, before the unplanned full-data epoch trains."""
    trainer = enable_epoch_sifting(FakeTrainer(train_loader(), num_train_epochs=3), EPOCH_CONFIG)
    stream = trainer.get_train_dataloader()
    loader = trainer.epoch_sifting_dataloader

    def train_an_epoch():
        for (ids,) in stream:
            loader.weighted_loss(ids.float())  # a loss per sample: the plans follow the scores

    assert len(stream) == 5  # plans of 8, 4 and 4 batches, 3 Trainer epochs of 5
    for _ in range(3):
        train_an_epoch()
        check_within_plan(loader)  # the planned epochs
    train_an_epoch()  # its last 4 batches are of an unplanned epoch
    with pytest.raises(RuntimeError, match=r"past the epoch-sifting plan of num_train_epochs=3 epochs \(epoch 3,"):
        trainer.compute_loss(trainer.model, {"labels": torch.zeros(4, dtype=torch.long)})

    data = DataLoader(TensorDataset(torch.arange(16)), batch_size=4, shuffle=True)
    expected = EpochSiftingDataloader({"seed": 0}, data, num_epochs=3)  # no budget: expected lengths
    assert not expected.length_is_exact  # a run may need part of one more epoch: not refused
    for _ in range(4):
        list(expected)
    check_within_plan(expected)


@pytest.mark.slow
def test_a_real_trainer_runs_as_long_as_its_plan():
    """64 samples, batch 8, kept share 0.5, num_train_epochs=4: plans of 8, 4, 4 and 8 batches,
    24 optimizer steps."""
    r = scenarios("epoch", "lengths")["lengths"]
    assert r["whole_plan"] == {"global_step": 24, "kinds": ["warmup", "sift", "sift", "anneal"], "warnings": []}
    within = r["within"]
    assert within["global_step"] == 10 and within["kinds"] == ["warmup", "sift"]
    assert len(within["warnings"]) == 1 and "stops after 10 of the 24 optimizer steps" in within["warnings"][0]
    for name, steps, planned in (("beyond", 30, 24), ("beyond_with_accumulation", 13, 12)):
        assert r[name]["global_step"] == 0  # refused before any step
        assert f"max_steps={steps} asks for more" in r[name]["refused"]
        assert f"are {planned} optimizer steps" in r[name]["refused"] and "max_steps=-1" in r[name]["refused"]
    assert "num_train_epochs must be a whole number >= 1, got 2.5" in r["fractional"]
