"""``Trainer.fit(ckpt_path=...)`` resumes both sifting loaders exactly, with ``SiftingResume``.

A real Lightning ``Trainer`` on CPU saves a checkpoint after every training step
(``ModelCheckpoint(every_n_train_steps=1)``); runs resumed from a checkpoint in the middle
of an epoch and from one at an epoch's last batch must train the uninterrupted run's
remaining batches (the same sample ids, in the same epochs) and end with its weights,
bit for bit. The resumed module starts from other weights, so equal weights also say the
model came back from the checkpoint.
"""

import contextlib
import io

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations.lightning_checkpoint import SiftingResume
from neuron_sift.integrations.schedules import ExactLengthLoader
from tests.neuron_sift.integrations.readme_examples import example

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # Lightning's note that the resumed Trainer lacks the saving run's ModelCheckpoint.
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
]

N, B, EPOCHS = 100, 8, 3


class CrossEntropy:
    def loss(self, model, transformed_batch, original_batch=None):
        _ids, x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


class Classifier(LightningModule):
    """Records the ids of every trained batch with Lightning's epoch number."""

    def __init__(self, kind, init_seed=0, wrap=True):
        super().__init__()
        torch.manual_seed(init_seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        g = torch.Generator().manual_seed(1)
        self.data = TensorDataset(
            torch.arange(N), torch.randn(N, 10, generator=g), torch.randint(0, 3, (N,), generator=g)
        )
        self.kind, self.wrap = kind, wrap
        self.trained = []

    def forward(self, x):
        return self.net(x)

    def setup(self, stage):
        # A seeded sampler: ExactLengthLoader calls set_epoch on it for every pass of the per-batch loader.
        source = DataLoader(
            self.data, batch_size=B, sampler=DistributedSampler(self.data, num_replicas=1, rank=0, seed=7)
        )
        if self.kind == "sifting":
            config = RelativeProbabilisticSiftConfig(
                beta_value=1.0,
                loss_history_length=32,
                loss_based_sift_config={"sift_config": {"sift_delay": 2}},
                selection_mode="probabilistic",
                seed=5,
            )
            self.loader = SiftingDataloader(config, source, loss_impl=CrossEntropy(), model=self)
        else:
            config = EpochSiftConfig(kept_share=0.5, warmup_epochs=1, seed=3)
            self.loader = EpochSiftingDataloader(config, source, num_epochs=EPOCHS)

    def train_dataloader(self):
        return ExactLengthLoader(self.loader, epochs=self.trainer.max_epochs) if self.wrap else self.loader

    def training_step(self, batch, batch_idx):
        ids, x, y = batch
        self.trained.append((self.current_epoch, ids.tolist()))
        per_sample = torch.nn.functional.cross_entropy(self(x), y, reduction="none")
        return self.loader.weighted_loss(per_sample) if self.kind == "epoch" else per_sample.mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(callbacks=(), sifting_resume=True):
    return Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[SiftingResume(), *callbacks] if sifting_resume else list(callbacks),
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def weights(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


@pytest.fixture(scope="module", params=["sifting", "epoch"])
def saved_run(request, tmp_path_factory):
    """The uninterrupted run, saving a checkpoint after every step."""
    directory = tmp_path_factory.mktemp(f"lightning_{request.param}")
    module = Classifier(request.param)
    every_step = ModelCheckpoint(directory, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    fit = trainer([every_step])
    fit.fit(module)
    return request.param, module, fit, directory


def resume(kind, directory, step, wrap=True, sifting_resume=True):
    module = Classifier(kind, init_seed=99, wrap=wrap)
    fit = trainer(sifting_resume=sifting_resume)
    fit.fit(module, ckpt_path=str(directory / f"step={step}.ckpt"))
    return module, fit


@pytest.mark.parametrize("where", ["mid_epoch", "epoch_end", "late_mid_epoch"])
def test_a_resumed_fit_trains_the_uninterrupted_runs_remaining_batches(saved_run, where):
    kind, full, full_fit, directory = saved_run
    per_epoch = full_fit.num_training_batches
    assert len(full.trained) == EPOCHS * per_epoch and per_epoch > 4
    step = {"mid_epoch": 3, "epoch_end": per_epoch, "late_mid_epoch": per_epoch + 3}[where]
    module, fit = resume(kind, directory, step)
    assert module.trained == full.trained[step:]  # ids and Lightning's epoch numbers
    assert fit.global_step == full_fit.global_step
    assert torch.equal(weights(module), weights(full))


@pytest.mark.parametrize("where", ["mid_epoch", "epoch_end"])
def test_without_sifting_resume_a_wrapped_loader_still_resumes_exactly(saved_run, where):
    """A user who forgot the callback: ``ExactLengthLoader`` hears Lightning start the next
    epoch (``sampler.set_epoch``) after a checkpoint at an epoch's last batch, and closes the
    restored epoch. Before 0.9.0 the run resumed into that epoch's empty rest and ended an
    epoch early (the epoch loader trained 0 of the remaining 11 steps here, silently)."""
    kind, full, full_fit, directory = saved_run
    per_epoch = full_fit.num_training_batches
    step = {"mid_epoch": 3, "epoch_end": 2 * per_epoch}[where]
    module, fit = resume(kind, directory, step, sifting_resume=False)
    assert module.trained == full.trained[step:]
    assert fit.global_step == full_fit.global_step
    assert torch.equal(weights(module), weights(full))


@pytest.mark.parametrize("kind", ["sifting", "epoch"])
def test_a_checkpoint_of_a_bare_loader_is_refused_naming_the_fix(tmp_path, kind):
    """Lightning cannot resume a bare loader exactly (the library module's docstring)."""
    module = Classifier(kind, wrap=False)
    fit = trainer([ModelCheckpoint(tmp_path, filename="{step}", every_n_train_steps=1, save_top_k=-1)])
    fit.fit(module)
    with pytest.raises(ValueError, match=r"bare (Epoch)?SiftingDataloader.*ExactLengthLoader\(loader, epochs="):
        resume(kind, tmp_path, 3, wrap=False)


def test_the_docs_example_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(example("Resuming a Lightning run from a checkpoint"), "docs/lightning.md", "exec"), namespace)
    assert "same weights: True" in out.getvalue()
    assert (tmp_path / "checkpoints" / "step=5.ckpt").is_file()
    first, resumed = namespace["first"], namespace["resumed"]
    assert first.trainer.global_step == resumed.trainer.global_step > 5


def lightning_checkpoint(loader_state, *, is_last_batch=False, processed=0, started=1):
    """The parts of a Lightning checkpoint that ``SiftingResume`` reads."""
    return {
        "loops": {
            "fit_loop": {
                "state_dict": {"combined_loader": [loader_state]},
                "epoch_loop.batch_progress": {"is_last_batch": is_last_batch},
                "epoch_progress": {"current": {"processed": processed, "started": started}},
            }
        }
    }


def fresh_loader():
    module = Classifier("sifting")
    module.setup("fit")
    return module.loader


@pytest.fixture
def mid_epoch_state():
    """An ExactLengthLoader's state two batches into its first epoch."""
    exact = ExactLengthLoader(fresh_loader(), epochs=EPOCHS)
    batches = iter(exact)
    next(batches), next(batches)
    return exact.state_dict()


def test_an_epoch_end_checkpoint_closes_the_open_epoch_and_a_mid_epoch_one_is_kept(mid_epoch_state):
    kept = lightning_checkpoint(mid_epoch_state)
    SiftingResume().on_load_checkpoint(None, None, kept)
    assert kept["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [mid_epoch_state]
    for ended in (
        lightning_checkpoint(mid_epoch_state, is_last_batch=True),
        lightning_checkpoint(mid_epoch_state, processed=1),
    ):
        SiftingResume().on_load_checkpoint(None, None, ended)
        (closed,) = ended["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert mid_epoch_state["epoch_yielded"] == 2 and closed["epoch_yielded"] is None
        assert {k: v for k, v in closed.items() if k not in ("epoch_yielded", "checksum")} == {
            k: v for k, v in mid_epoch_state.items() if k not in ("epoch_yielded", "checksum")
        }
        restored = ExactLengthLoader(fresh_loader(), epochs=EPOCHS)
        restored.load_state_dict(closed)  # the rewritten state carries a valid checksum
        assert len(restored) == restored.steps_per_epoch  # a whole new epoch, as Lightning starts one


def test_damaged_or_unreadable_checkpoints_are_refused(mid_epoch_state):
    edited = dict(mid_epoch_state, passes=mid_epoch_state["passes"] + 1)
    with pytest.raises(ValueError, match="checksum"):
        SiftingResume().on_load_checkpoint(None, None, lightning_checkpoint(edited, is_last_batch=True))
    not_a_list = lightning_checkpoint(mid_epoch_state)
    not_a_list["loops"]["fit_loop"]["state_dict"]["combined_loader"] = {"train": mid_epoch_state}
    with pytest.raises(ValueError, match="not the list Lightning writes"):
        SiftingResume().on_load_checkpoint(None, None, not_a_list)
    no_progress = lightning_checkpoint(mid_epoch_state)
    del no_progress["loops"]["fit_loop"]["epoch_progress"]
    with pytest.raises(ValueError, match="no epoch progress"):
        SiftingResume().on_load_checkpoint(None, None, no_progress)
    untouched = {"state_dict": {}}  # a checkpoint without loops or loader states: nothing to do
    SiftingResume().on_load_checkpoint(None, None, untouched)
    assert untouched == {"state_dict": {}}


def test_lightning_before_2_5_is_refused_naming_the_fix(monkeypatch):
    """2.4 resumes a checkpoint of an epoch's last batch inside that epoch (the bound in setup.py)."""
    import lightning

    from neuron_sift.integrations.lightning_checkpoint import SiftingResume

    monkeypatch.setattr(lightning, "__version__", "2.4.0")
    with pytest.raises(RuntimeError, match=r"Lightning 2.5 or newer \(installed: 2.4\).*lightning>=2.5"):
        SiftingResume()
    monkeypatch.setattr(lightning, "__version__", "2.10.1rc1")
    SiftingResume()
