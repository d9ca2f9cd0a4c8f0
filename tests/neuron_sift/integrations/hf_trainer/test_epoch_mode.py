"""``enable_epoch_sifting`` with a real ``transformers.Trainer``: classification and causal
LM, gradient accumulation, torch-xla, and resuming from a checkpoint (runs in subprocesses,
``trainer_scenarios.py``); the stream state's refusals."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting, state_file
from neuron_sift.integrations.hf_trainer.checkpoint import load_state, restore_at_epoch_end
from neuron_sift.integrations.schedules import ExactLengthLoader
from tests.neuron_sift.integrations.hf_trainer.fake_trainer import FakeTrainer, train_loader
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import scenarios


@pytest.mark.slow
def test_hugging_face_trainer_scenarios():
    out = scenarios("epoch", "cpu")
    for name in ("classification", "causal_lm", "classification_sharded"):
        r = out[name]
        assert r["scores_recorded"] == 96 and r["unpaired"] == 0
        assert r["kinds"] == ["warmup", "sift", "sift", "anneal"] and r["kept"] == [96, 48, 48, 96]
        assert r["planned"] == 36  # every planned batch trained, each with its loss recorded
        assert r["logged"] and r["eval_loss"] is not None and not r["sifting_logged"]
        assert r["loader_type"] == "ExactLengthLoader"
        # accelerate's DataLoaderShard is rebuilt around the plan's DataLoader, not dropped
        assert r["source"] == r["rebuilt"] == "DataLoaderShard.base_dataloader -> DataLoader"
    assert out["classification"]["global_step"] == 36  # the Trainer ran exactly the planned steps
    assert out["classification_sharded"]["global_step"] == 36  # the same schedule from a sharded table
    assert out["causal_lm"]["global_step"] == 4 * 5  # 9 batches per Trainer epoch, accumulation 2


@pytest.mark.slow
@pytest.mark.xla
def test_hugging_face_trainer_on_xla():
    """Wherever torch-xla is installed the Trainer trains on accelerate's MpDeviceLoaderWrapper
    around a DataLoaderShard: the epoch loader rebuilds both around its DataLoader. 64 samples,
    batch 8, 5 Trainer epochs of 5 batches: warm-up, 3 sifted epochs at half, annealing."""
    r = scenarios("epoch", "xla")["xla"]
    chain = "MpDeviceLoaderWrapper._loader -> DataLoaderShard.base_dataloader -> DataLoader"
    assert r["source"] == r["rebuilt"] == chain
    assert r["backend"] == "xla" and r["kinds"] == ["warmup", "sift", "sift", "sift", "anneal"]
    assert r["global_step"] == r["planned"] == 25 and r["scores_recorded"] == 64 and r["unpaired"] == 0
    compiles = r["compiles"]
    assert len(compiles) == 5 and compiles[1:] == [compiles[0]] * 4, compiles  # no graph after the first epoch


@pytest.mark.slow
def test_hugging_face_trainer_resumes_from_a_checkpoint():
    """64 samples, batch 8, 4 Trainer epochs of 6 steps; checkpoints at step 12 (the end of
    the second epoch) and step 9 (mid-epoch). Resumed from either, the Trainer trains the
    very samples of the uninterrupted run's later steps, in the same batches, also from the
    state as 0.4.0 wrote it (test_checkpoint.py covers both modes and devices)."""
    r = scenarios("epoch", "resume")["resume"]
    assert r["per_epoch"] == 6 and len(r["full_steps"]) == 24
    assert r["saved"] == ["epoch_sifting_rank0.pt"] and r["saved_kind"] == "ExactLengthLoader"
    assert r["resumed_steps"] == r["full_steps"][12:]
    assert r["mid_epoch"] == r["full_steps"][9:]
    assert r["resumed_from_0_4_0_at_12"] == r["full_steps"][12:]
    assert r["resumed_from_0_4_0_at_9"] == r["full_steps"][9:]
    assert r["global_step"] == 24 and r["same_weights"]
    assert r["kinds"] == ["warmup", "sift", "sift", "anneal"] and r["unpaired"] == 0


def test_resuming_from_a_checkpoint_without_the_sifting_state(tmp_path):
    with pytest.raises(ValueError, match="holds no epoch_sifting_rank0.pt: the checkpoint was not saved by a Trainer"):
        load_state(str(tmp_path), "epoch_sifting", 0)
    assert state_file(0) == "epoch_sifting_rank0.pt"


def stream(per_epoch=4):
    loader = EpochSiftingDataloader({"seed": 0}, DataLoader(TensorDataset(torch.zeros(16, 1)), batch_size=4))
    return loader, ExactLengthLoader(loader, per_epoch)


def yielded(per_epoch, batches):
    """The state of a stream of ``per_epoch`` batches per epoch after ``batches`` of its first epoch."""
    _, s = stream(per_epoch)
    it = iter(s)
    for _ in range(batches):
        next(it)
    return s.state_dict()


def test_the_stream_state_refuses_another_run():
    loader, s = stream(4)
    state = s.state_dict()
    assert state["kind"] == "ExactLengthLoader" and state["epoch_yielded"] is None and state["steps_per_epoch"] == 4
    another_run = yielded(3, 0)  # a run planning 3 batches per Trainer epoch
    with pytest.raises(ValueError, match="had 3 batches per Trainer epoch, this one plans 4"):
        restore_at_epoch_end(s, another_run)
    with pytest.raises(ValueError, match="taken 2 of 4 batches into a Trainer epoch, not at its end"):
        restore_at_epoch_end(s, yielded(4, 2))
    with pytest.raises(ValueError, match="not an ExactLengthLoader state: it comes from EpochSiftingDataloader"):
        restore_at_epoch_end(s, loader.state_dict())
    with pytest.raises(ValueError, match="checkpoint has steps_per_epoch=3 but this loader has 4"):
        s.load_state_dict(another_run)
    restore_at_epoch_end(s, state)
    epoch_end = yielded(4, 4)  # the epoch's last batch yielded: a new epoch follows
    assert epoch_end["epoch_yielded"] == 4
    restore_at_epoch_end(s, epoch_end)
    assert len(s) == 4


def test_a_0_4_0_epoch_stream_state_still_loads():
    """0.4.0's EpochStream saved {loader, per_epoch, in_epoch} (no kind, no version)."""
    loader, s = stream(4)
    old = {"loader": loader.state_dict(), "per_epoch": 4, "in_epoch": 0}
    s.load_state_dict(old)
    assert len(s) == 4 and len(list(s)) == 4
    s.load_state_dict({**old, "kind": "EpochStream", "version": 1, "in_epoch": 1})
    assert len(s) == 3
    with pytest.raises(ValueError, match="not an EpochStream state of a version this neuron_sift reads: version 2"):
        s.load_state_dict({**old, "kind": "EpochStream", "version": 2})


# -- evaluation through the compute_loss hook -------------------------------------------------


class ClassicOverride(FakeTrainer):
    """A subclass's compute_loss in the signature written before transformers 4.46 (no
    num_items_in_batch). With sifting the hook computes the training loss, so such a
    Trainer trains; evaluation still calls this method."""

    def compute_loss(self, model, inputs, return_outputs=False):
        return ("own loss", return_outputs)


class CurrentSignature(FakeTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return ("own loss", return_outputs, num_items_in_batch)


def test_evaluation_gets_the_trainers_own_loss_with_only_the_arguments_it_passed():
    """Evaluation (the model in eval mode) calls compute_loss(model, inputs, return_outputs=True):
    the hook hands the Trainer's own compute_loss exactly that, with no num_items_in_batch
    added that a classic override does not take."""
    model = torch.nn.Linear(1, 2).eval()
    classic = enable_epoch_sifting(ClassicOverride(train_loader()), {"seed": 0})
    assert classic.compute_loss(model, {"x": 1}, return_outputs=True) == ("own loss", True)
    current = enable_epoch_sifting(CurrentSignature(train_loader()), {"seed": 0})
    assert current.compute_loss(model, {"x": 1}, return_outputs=True) == ("own loss", True, None)
    assert current.compute_loss(model, {"x": 1}, num_items_in_batch=12) == ("own loss", False, 12)
