"""Integrations of epoch-level sifting: the Hugging Face Trainer (classification and causal
LM, gradient accumulation), PyTorch Lightning, the metrics surface and TensorBoard."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from neuron_sift.metrics.epoch_metrics import epoch_metrics, log_epoch_metrics, write_epoch_tensorboard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def trainer_scenarios(which, use_torch_xla):
    """Runs in a subprocess: transformers and accelerate choose torch-xla once, at import."""
    pytest.importorskip("transformers")
    env = dict(os.environ, USE_TORCH_XLA=use_torch_xla, PJRT_DEVICE="CPU", PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "tests.neuron_sift.epoch.epoch_trainer_scenarios", which],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_hugging_face_trainer_scenarios():
    out = trainer_scenarios("cpu", use_torch_xla="0")
    for name in ("classification", "causal_lm"):
        r = out[name]
        assert r["scores_recorded"] == 96 and r["unpaired"] == 0
        assert r["kinds"] == ["warmup", "sift", "sift", "anneal"] and r["kept"] == [96, 48, 48, 96]
        assert r["planned"] == 36  # every planned batch trained, each with its loss recorded
        assert r["logged"] and r["eval_loss"] is not None
        # accelerate's DataLoaderShard is rebuilt around the plan's DataLoader, not dropped
        assert r["source"] == r["rebuilt"] == "DataLoaderShard.base_dataloader -> DataLoader"
    assert out["classification"]["global_step"] == 36  # the Trainer ran exactly the planned steps
    assert out["causal_lm"]["global_step"] == 4 * 5  # 9 batches per Trainer epoch, accumulation 2


@pytest.mark.slow
@pytest.mark.xla
def test_hugging_face_trainer_on_xla():
    """Wherever torch-xla is installed the Trainer trains on accelerate's MpDeviceLoaderWrapper
    around a DataLoaderShard: the epoch loader rebuilds both around its DataLoader. 64 samples,
    batch 8, 5 Trainer epochs of 5 batches: warm-up, 3 sifted epochs at half, annealing."""
    r = trainer_scenarios("xla", use_torch_xla="1")["xla"]
    chain = "MpDeviceLoaderWrapper._loader -> DataLoaderShard.base_dataloader -> DataLoader"
    assert r["source"] == r["rebuilt"] == chain
    assert r["backend"] == "xla" and r["kinds"] == ["warmup", "sift", "sift", "sift", "anneal"]
    assert r["global_step"] == r["planned"] == 25 and r["scores_recorded"] == 64 and r["unpaired"] == 0
    compiles = r["compiles"]
    assert len(compiles) == 5 and compiles[1:] == [compiles[0]] * 4, compiles  # no graph after the first epoch


@pytest.mark.slow
def test_hugging_face_trainer_resumes_from_a_checkpoint():
    """64 samples, batch 8, 4 Trainer epochs of 6 steps; checkpoints at step 12 (the end of
    the second epoch) and step 9 (mid-epoch). Resumed from step 12 the Trainer trains the
    very samples of the uninterrupted run's steps 13 to 24, in the same batches; from step 9
    it is refused, before accelerate's skipping would fail on the sifted stream."""
    r = trainer_scenarios("resume", use_torch_xla="0")["resume"]
    assert r["per_epoch"] == 6 and len(r["full_steps"]) == 24
    assert r["saved"] == ["epoch_sifting_rank0.pt"]
    assert r["resumed_steps"] == r["full_steps"][12:]
    assert r["global_step"] == 24 and r["same_weights"]
    assert r["kinds"] == ["warmup", "sift", "sift", "anneal"] and r["unpaired"] == 0
    assert "taken 3 of 6 batches into an epoch" in r["mid_epoch"] and "save_strategy='epoch'" in r["mid_epoch"]


def test_resuming_from_a_checkpoint_without_the_sifting_state(tmp_path):
    from neuron_sift.integrations.epoch_trainer import _load_stream_state

    with pytest.raises(ValueError, match="holds no epoch_sifting_rank0.pt: the checkpoint was not saved by a Trainer"):
        _load_stream_state(str(tmp_path), 0)


def test_the_stream_state_refuses_another_run():
    from neuron_sift.integrations.epoch_trainer import EpochStream

    loader = EpochSiftingDataloader({"seed": 0}, DataLoader(TensorDataset(torch.zeros(16, 1)), batch_size=4))
    stream = EpochStream(loader, 4)
    state = stream.state_dict()
    assert state["in_epoch"] == 0 and state["per_epoch"] == 4
    with pytest.raises(ValueError, match="had 3 batches per Trainer epoch, this one plans 4"):
        stream.load_state_dict({**state, "per_epoch": 3})
    with pytest.raises(ValueError, match="not an EpochStream state"):
        stream.load_state_dict(loader.state_dict())
    stream.load_state_dict(state)


def small_parts(epochs=4):
    """A linear classifier, its SGD and a budgeted epoch loader over 256 samples in batches of 32."""
    torch.manual_seed(0)
    x = torch.randn(256, 6)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    loader = EpochSiftingDataloader(
        {"seed": 0, "kept_share": 0.5}, DataLoader(TensorDataset(x, y), batch_size=32), num_epochs=epochs
    )
    return model, opt, loader


def small_run(epochs=4):
    model, opt, loader = small_parts(epochs)
    total = loader.planned_steps()  # exact with a budget: the schedule's length
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


def test_a_schedule_sized_by_planned_steps_ends_exactly_at_zero():
    loader, sched, steps = small_run()
    assert steps == 8 + 4 + 4 + 4
    assert sched.get_last_lr()[0] == pytest.approx(0.0)


def test_metrics_surface_log_lines_and_tensorboard(tmp_path, caplog):
    loader, _, _ = small_run()
    snap = epoch_metrics(loader)
    s = snap.scalars("p/")
    assert s["p/scores_recorded"] == 256 and s["p/num_nonfinite_losses"] == 0
    assert s["p/kept_share"] == 0.5 and "p/epoch" in s and s["p/planning_seconds"] > 0
    kept = 1 / loader.plan.inclusion[loader.plan.order]  # the last epoch's weights: 1 / keep probability
    assert s["p/mean_weight"] == pytest.approx(float(kept.mean()), rel=1e-6) and s["p/mean_weight"] > 1
    assert s["p/max_weight"] == pytest.approx(float(kept.max()), rel=1e-6)
    assert [e["kept_share"] for e in snap.epochs] == [1.0, 0.5, 0.5, 0.5]
    with caplog.at_level("INFO", logger="neuron_sift.epoch.loader"):
        log_epoch_metrics(loader)
    assert "kept_share: 0.5" in caplog.text
    tb = pytest.importorskip("torch.utils.tensorboard")
    writer = tb.SummaryWriter(str(tmp_path))
    write_epoch_tensorboard(loader, writer, step=3)
    writer.close()
    assert any(f.startswith("events") for f in os.listdir(tmp_path))
    with pytest.raises(TypeError, match="no EpochSiftingDataloader"):
        epoch_metrics([1, 2])


@pytest.mark.slow
def test_lightning_fit_with_the_epoch_loader():
    L = pytest.importorskip("lightning.pytorch")
    from neuron_sift.metrics.epoch_metrics import lightning_callback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6, 2)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(200, 6, generator=g)
            y = (x[:, 0] > 0).long()
            self.sift = EpochSiftingDataloader(
                {"seed": 0, "kept_share": 0.4}, DataLoader(TensorDataset(x, y), batch_size=16), num_epochs=4
            )
            return self.sift

        def training_step(self, batch, i):
            x, y = batch
            return self.sift.weighted_loss(F.cross_entropy(self.net(x), y, reduction="none"))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    m = Module()
    trainer = L.Trainer(
        max_epochs=4,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[lightning_callback()],
    )
    trainer.fit(m)
    metrics = m.sift.metrics()
    assert [e["kind"] for e in metrics["epochs"]] == ["warmup", "sift", "sift", "sift"]
    assert metrics["scores_recorded"] == 200 and metrics["unpaired_batches"] == 0
    assert trainer.global_step == 13 + 3 * 5
    assert "epoch_sifting/kept_share" in trainer.callback_metrics


def test_the_runnable_example():
    import importlib.util

    path = os.path.join(ROOT, "examples", "epoch_sifting.py")
    spec = importlib.util.spec_from_file_location("epoch_sifting_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--epochs", "8", "--samples", "2000"]) > 0.8


def test_metrics_report_the_planners_planned_steps():
    """The metrics surface shows the batches the run still trains (what the schedule and the
    Trainer are sized by), counted here by training them: before the run and at each step."""
    model, opt, loader = small_parts(4)
    reported = [epoch_metrics(loader).values["planned_steps"]]
    for _ in range(4):
        for xb, yb in loader:
            reported.append(epoch_metrics(loader).scalars()["planned_steps"])  # this batch not trained yet
            loss = loader.weighted_loss(F.cross_entropy(model(xb), yb, reduction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
    steps = len(reported) - 1
    assert steps == 8 + 3 * 4
    assert reported == [steps] + list(range(steps, 0, -1))
    assert epoch_metrics(loader).values["planned_steps"] == 0
    no_length = EpochSiftingDataloader({}, DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=4))
    assert "planned_steps" not in epoch_metrics(no_length).scalars()
