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


@pytest.mark.slow
def test_hugging_face_trainer_scenarios():
    pytest.importorskip("transformers")
    env = dict(os.environ, USE_TORCH_XLA="0", PJRT_DEVICE="CPU", PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "tests.neuron_sift.epoch.epoch_trainer_scenarios"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("classification", "causal_lm"):
        r = out[name]
        assert r["scores_recorded"] == 96 and r["unpaired"] == 0
        assert r["kinds"] == ["warmup", "sift", "sift", "anneal"] and r["kept"] == [96, 48, 48, 96]
        assert r["planned"] == 36  # every planned batch trained, each with its loss recorded
        assert r["logged"] and r["eval_loss"] is not None
    assert out["classification"]["global_step"] == 36  # the Trainer ran exactly the planned steps
    assert out["causal_lm"]["global_step"] == 4 * 5  # 9 batches per Trainer epoch, accumulation 2


def small_run(epochs=4):
    torch.manual_seed(0)
    x = torch.randn(256, 6)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    loader = EpochSiftingDataloader(
        {"seed": 0, "kept_share": 0.5}, DataLoader(TensorDataset(x, y), batch_size=32), num_epochs=epochs
    )
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
    assert s["p/kept_share"] == 0.5 and {"p/mean_weight", "p/epoch", "p/planning_seconds"} <= set(s)
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
    """The metrics surface shows the same count the schedule and the Trainer are sized by."""
    loader, _, steps = small_run(epochs=4)
    assert epoch_metrics(loader).scalars()["planned_steps"] == loader.planned_steps() == 0
    fresh = EpochSiftingDataloader(
        {"seed": 0, "kept_share": 0.5}, DataLoader(TensorDataset(torch.zeros(256, 1)), batch_size=32), num_epochs=4
    )
    assert epoch_metrics(fresh).values["planned_steps"] == fresh.planned_steps() == steps
    no_length = EpochSiftingDataloader({}, DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=4))
    assert "planned_steps" not in epoch_metrics(no_length).scalars()
