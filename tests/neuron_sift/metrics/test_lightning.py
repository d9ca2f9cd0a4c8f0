"""``TrainingMetricsRecorder`` with a real Lightning ``Trainer`` on CPU.

The LightningModule is the ``model`` of its own ``SiftingDataloader``, which
``train_dataloader()`` returns (as smart_sifting scripts do), or an ``ExactLengthLoader``
around it (the README's recommendation).
"""

import contextlib
import io
import re
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations.schedules import ExactLengthLoader
from neuron_sift.metrics.lightning import TrainingMetricsRecorder
from tests.helpers.subprocess_limits import LIMIT_S
from tests.neuron_sift.integrations.readme_examples import example

pytestmark = pytest.mark.usefixtures("one_thread")


class MemoryLogger(Logger):
    """A Lightning logger keeping every ``log_metrics`` call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def sifting(self):
        return [(step, m) for step, m in self.calls if any(k.startswith("sifting/") for k in m)]


class CELoss(Loss):
    def __init__(self):
        self.models = []

    def loss(self, model, transformed_batch, original_batch=None):
        self.models.append(model)
        x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


class Classifier(L.LightningModule):
    def __init__(self, mode="probabilistic", n=256, batch_size=16, wrap=False, delay=2):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.mode, self.batch_size, self.wrap, self.delay = mode, batch_size, wrap, delay
        self.loss_impl = CELoss()
        self.sifting = None

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        self.sifting = SiftingDataloader(
            sift_config=RelativeProbabilisticSiftConfig(
                beta_value=1,
                loss_history_length=64,
                loss_based_sift_config={"sift_config": {"sift_delay": self.delay}},
                selection_mode=self.mode,
                seed=0,
            ),
            orig_dataloader=DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size, shuffle=True),
            loss_impl=self.loss_impl,
            model=self,
        )
        if self.wrap:
            return ExactLengthLoader(self.sifting, epochs=self.trainer.max_epochs)
        return self.sifting


def fit(module, recorder, max_epochs=3, loggers=None):
    loggers = loggers if loggers is not None else [MemoryLogger()]
    trainer = L.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        logger=loggers,
        callbacks=[recorder],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module)
    recorder_warnings = [str(w.message) for w in caught if "TrainingMetricsRecorder" in str(w.message)]
    return trainer, loggers, recorder_warnings


def test_recorder_logs_sifting_metrics_through_the_trainer_logger():
    module = Classifier("probabilistic", n=256, batch_size=16, delay=2)
    before = [p.detach().clone() for p in module.parameters()]
    recorder = TrainingMetricsRecorder(log_every_n_steps=3)
    trainer, (memory,), _ = fit(module, recorder, max_epochs=3)

    sifting = module.sifting
    assert module.loss_impl.models and all(m is module for m in module.loss_impl.models)  # scored by the module
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, module.parameters()))  # real training
    logged = memory.sifting()
    batches = sifting.counts.num_batches_emitted
    steps = [step for step, _ in logged]
    assert len(steps) == len(set(steps)), steps  # no step logged twice (an epoch's last batch included)
    every_third = set(range(3, batches + 1, 3))
    assert every_third <= set(steps) and len(set(steps) - every_third) <= 3  # every 3 batches, plus epoch ends
    names = set(logged[-1][1])
    for name in (
        "num_orig_samples_seen",
        "num_orig_samples_kept",
        "observed_kept_share",
        "loss_history_q10",
        "loss_history_q50",
        "loss_history_q90",
        "machinery_latency",
        "batch_creation_latency",
    ):
        assert "sifting/" + name in names
    seen = [m["sifting/num_orig_samples_seen"] for _, m in logged]
    assert seen == sorted(seen) and seen[0] > 0
    steps = [step for step, _ in logged]
    assert steps == sorted(steps) and steps[-1] == trainer.global_step
    # The last record is the final state of the loader.
    final = logged[-1][1]
    c = sifting.counts
    assert final["sifting/num_orig_samples_seen"] == c.num_orig_samples_seen
    assert final["sifting/num_orig_samples_kept"] == c.num_orig_samples_kept
    assert final["sifting/observed_kept_share"] == pytest.approx(c.num_orig_samples_kept / c.num_orig_samples_seen)
    fill = int(sifting.sifter.state.fill)
    assert final["sifting/loss_history_q50"] == pytest.approx(sifting.sifter.state.history[:fill].quantile(0.5).item())
    assert final["sifting/loss_history_q10"] <= final["sifting/loss_history_q50"] <= final["sifting/loss_history_q90"]
    assert final["sifting/machinery_latency"] > 0
    assert recorder.last.num_orig_samples_seen == c.num_orig_samples_seen
    assert [step for step, _ in recorder.records] == steps


def test_fixed_mode_epochs_of_planned_length_are_not_cut():
    # Fixed mode, 100 samples, batches of 8: epochs 0 and 1 emit 6 batches each, the
    # length Lightning read; the 13th (short) source batch is scored before the 6th batch
    # is handed out, so every sample is seen although Lightning stops after 6 batches.
    module = Classifier("fixed", n=100, batch_size=8, delay=0)
    recorder = TrainingMetricsRecorder()
    trainer, _, warned = fit(module, recorder, max_epochs=2)
    assert trainer.num_training_batches == 6
    assert recorder.cut_epochs == [] and warned == []
    assert module.sifting.counts.num_orig_samples_seen == 2 * 100


def test_recorder_warns_when_lightning_cuts_an_epoch_short():
    # Carried-over samples grow: epoch 3 would emit 7 batches, but Lightning keeps the 6 it
    # read at the start, so it stops early and the rest of that pass goes unused.
    module = Classifier("fixed", n=100, batch_size=8, delay=0)
    recorder = TrainingMetricsRecorder()
    trainer, _, warned = fit(module, recorder, max_epochs=4)
    assert trainer.num_training_batches == 6
    assert recorder.cut_epochs == [3]
    assert len(warned) == 1 and "ExactLengthLoader" in warned[0]
    assert module.sifting.counts.num_orig_samples_seen < 4 * 100


def test_exact_length_loader_gives_lightning_whole_epochs():
    module = Classifier("probabilistic", n=100, batch_size=8, wrap=True, delay=0)
    recorder = TrainingMetricsRecorder()
    trainer, _, warned = fit(module, recorder, max_epochs=4)
    assert warned == [] and recorder.cut_epochs == []
    loader = trainer.train_dataloader
    assert isinstance(loader, ExactLengthLoader)
    assert trainer.global_step == len(loader) * 4 == trainer.estimated_stepping_batches
    c = module.sifting.counts
    assert c.num_samples_emitted == trainer.global_step * 8
    assert abs(c.num_orig_samples_seen - 400) <= 3 * 8 * 2  # about 4 passes (within epochs / 2 batches)
    assert recorder.last.num_orig_samples_seen == c.num_orig_samples_seen


def test_recorder_writes_to_a_tensorboard_logger(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    module = Classifier("fixed", n=128, batch_size=16, wrap=True, delay=0)
    recorder = TrainingMetricsRecorder(log_every_n_steps=2)
    tb = TensorBoardLogger(str(tmp_path), name="tb")
    fit(module, recorder, max_epochs=2, loggers=[tb])
    tb.experiment.flush()
    acc = EventAccumulator(tb.log_dir)
    acc.Reload()
    assert {"sifting/observed_kept_share", "sifting/num_orig_samples_kept", "sifting/loss_history_q50"} <= set(
        acc.Tags()["scalars"]
    )
    assert acc.Scalars("sifting/observed_kept_share")[-1].value == pytest.approx(0.5)  # fixed mode, beta 1, no delay


def test_recorder_without_a_sifting_loader_warns_and_records_nothing():
    class Plain(Classifier):
        def train_dataloader(self):
            return DataLoader(TensorDataset(self.x, self.y), batch_size=16)

    recorder = TrainingMetricsRecorder()
    _, (memory,), warned = fit(Plain(), recorder, max_epochs=1)
    assert warned and "no SiftingDataloader" in warned[0]
    assert memory.sifting() == [] and recorder.records == []


def test_recorder_with_an_explicit_loader():
    """A loader the recorder cannot find by itself (hidden in a user's wrapper) is passed in."""

    class Hidden:
        def __init__(self, loader):
            self._inner = loader

        def __iter__(self):
            return iter(self._inner)

        def __len__(self):
            return len(self._inner)

    class Wrapped(Classifier):
        def train_dataloader(self):
            return Hidden(self.sifting)

    module = Wrapped("fixed", n=64, batch_size=16, delay=0)
    Classifier.train_dataloader(module)  # builds module.sifting
    recorder = TrainingMetricsRecorder(loader=module.sifting, log_every_n_steps=1)
    _, (memory,), warned = fit(module, recorder, max_epochs=1)
    assert warned == []
    # One record per step: the last step's record is the epoch-end snapshot, logged once.
    assert [step for step, _ in memory.sifting()] == [1, 2] and module.sifting.counts.num_batches_emitted == 2
    assert recorder.last.num_orig_samples_seen == 64
    with pytest.raises(ValueError):
        TrainingMetricsRecorder(log_every_n_steps=0)


@pytest.mark.slow
def test_lightning_fit_with_the_epoch_loader():
    """The same callback reports the epoch loader's scalars (under ``epoch_sifting/``)."""
    import torch.nn.functional as F

    from neuron_sift import EpochSiftingDataloader

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6, 2)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(200, 6, generator=g)
            y = (x[:, 0] > 0).long()
            self.sift = EpochSiftingDataloader(
                {"seed": 0, "kept_share": 0.4, "start_rank_correlation": None},
                DataLoader(TensorDataset(x, y), batch_size=16),
                num_epochs=4,
            )
            return self.sift

        def training_step(self, batch, i):
            x, y = batch
            return self.sift.weighted_loss(F.cross_entropy(self.net(x), y, reduction="none"))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    recorder = TrainingMetricsRecorder()
    m = Module()
    trainer, (memory,), warned = fit(m, recorder, max_epochs=4)
    metrics = m.sift.metrics()
    assert [e["kind"] for e in metrics["epochs"]] == ["warmup", "sift", "sift", "sift"]
    assert metrics["scores_recorded"] == 200 and metrics["unpaired_batches"] == 0
    assert trainer.global_step == 13 + 3 * 5
    assert warned == [] and recorder.cut_epochs == []
    logged = [(step, m) for step, m in memory.calls if "epoch_sifting/observed_kept_share" in m]
    assert logged and logged[-1][0] == trainer.global_step
    final = logged[-1][1]
    assert final["epoch_sifting/observed_kept_share"] == pytest.approx(metrics["observed_kept_share"])
    assert "epoch_sifting/kept_share" not in final  # 0.5.0's alias is gone
    assert final["epoch_sifting/scores_recorded"] == 200
    assert recorder.last.values["scores_recorded"] == 200


def test_readme_pytorch_lightning_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(example("Sifting in a LightningModule"), "README.md", "exec"), {"__name__": "__main__"})
    printed = out.getvalue()
    steps = int(re.search(r"steps: (\d+)", printed).group(1))
    share = float(re.search(r"kept share: ([\d.]+)", printed).group(1))
    assert steps > 0 and 0.4 < share < 0.7
    assert "epochs cut short: []" in printed
    assert list(Path("lightning_logs").rglob("metrics.csv"))


def test_neuron_sift_imports_without_the_optional_packages():
    """lightning, transformers, accelerate and tensorboard are needed only by the modules that use them."""
    code = """
import importlib.abc, sys
BLOCKED = ("lightning", "pytorch_lightning", "transformers", "accelerate", "tensorboard", "torch.utils.tensorboard")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED or name.startswith(tuple(b + "." for b in BLOCKED)):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import neuron_sift, neuron_sift.metrics, neuron_sift.integrations, neuron_sift.integrations.trainer
from neuron_sift.metrics import collect_metrics, log_metrics, write_tensorboard
from neuron_sift.integrations.schedules import ExactLengthLoader, planned_steps
try:
    import neuron_sift.metrics.lightning
except ImportError as e:
    assert "pip install lightning" in str(e), e
else:
    raise AssertionError("neuron_sift.metrics.lightning imported without lightning")
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
