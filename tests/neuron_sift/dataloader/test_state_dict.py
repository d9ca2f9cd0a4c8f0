"""Checkpoint and resume: a resumed run emits exactly what the uninterrupted run emits."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.helpers.state_roundtrip import roundtrip
from tests.helpers.subprocess_limits import LIMIT_S
from tests.neuron_sift.dataloader.fakes import LossTableDataset, OracleLoss, tiny_model

N, B, EPOCHS = 230, 16, 3  # 230 % 16 = 6: a short last batch every epoch


def make(mode, device="cpu", delay=3, repeat=True, beta=1.0, seed=5):
    losses = torch.rand(N, generator=torch.Generator().manual_seed(1))
    sampler = DistributedSampler(LossTableDataset(losses), num_replicas=1, rank=0, shuffle=True, seed=7)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=beta,
            loss_history_length=40,
            loss_based_sift_config={"sift_config": {"sift_delay": delay, "repeat_delay_per_epoch": repeat}},
            selection_mode=mode,
            seed=seed,
        ),
        orig_dataloader=DataLoader(LossTableDataset(losses), batch_size=B, sampler=sampler),
        loss_impl=OracleLoss(),
        model=tiny_model().to(device),
    )
    return loader, sampler


def run(loader, sampler, start_epoch=0, stop_after=None):
    """The user's loop; returns emitted id lists, stopping after ``stop_after`` batches."""
    out = []
    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for ids, _ in loader:
            out.append(ids.cpu().tolist())
            if stop_after is not None and len(out) == stop_after:
                return out, epoch
    return out, EPOCHS


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_resume_after_any_emitted_batch_matches_uninterrupted_run(mode):
    full, _ = run(*make(mode))
    assert len(full) > 20
    for stop in range(1, len(full)):
        first, epoch = run(*make(mode), stop_after=stop)
        loader, sampler = make(mode)
        saved = roundtrip(first_loader_state(mode, stop))
        loader.load_state_dict(saved)
        rest, _ = run(loader, sampler, start_epoch=epoch)
        assert first + rest == full, f"stop after {stop}"


def first_loader_state(mode, stop):
    loader, sampler = make(mode)
    run(loader, sampler, stop_after=stop)
    return loader.state_dict()


def test_state_round_trips_and_resumes_counts():
    loader, sampler = make("probabilistic")
    run(loader, sampler, stop_after=5)
    state = loader.state_dict()
    again, _ = make("probabilistic")
    again.load_state_dict(roundtrip(state))
    assert again.counts == loader.counts
    assert again.num_pending == loader.num_pending
    assert torch.equal(again.sifter.state.history, loader.sifter.state.history)
    assert again.state_dict()["sift_state"]["draws"] == state["sift_state"]["draws"]


def test_mode_and_history_mismatch_are_rejected():
    loader, sampler = make("fixed")
    run(loader, sampler, stop_after=3)
    state = loader.state_dict()
    other, _ = make("probabilistic")
    with pytest.raises(ValueError, match="selection_mode"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        other.load_state_dict({"version": 99})


def test_pending_strings_and_dicts_survive_weights_only_load():
    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 50

        def __getitem__(self, i):
            return {"id": torch.tensor(i), "text": f"s{i}", "loss": torch.tensor((i * 7919 % 101) / 101.0)}

    class DictLoss:
        def loss(self, model, transformed_batch, original_batch=None):
            return original_batch["loss"]

    def build():
        return SiftingDataloader(
            sift_config=RelativeProbabilisticSiftConfig(
                beta_value=1.0,
                loss_history_length=20,
                loss_based_sift_config={"sift_config": {"sift_delay": 0}},
                seed=1,
            ),
            orig_dataloader=DataLoader(DS(), batch_size=8),
            loss_impl=DictLoss(),
            model=tiny_model(),
        )

    uninterrupted = build()
    full = [(b["id"].tolist(), b["text"]) for _ in range(2) for b in uninterrupted]
    loader = build()
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    assert loader.num_pending > 0
    state = roundtrip(loader.state_dict())
    resumed = build()
    resumed.load_state_dict(state)
    rest = [(b["id"].tolist(), b["text"]) for b in resumed] + [(b["id"].tolist(), b["text"]) for b in resumed]
    got = [(b["id"].tolist(), b["text"]) for b in first] + rest
    assert got == full


def test_resume_in_a_fresh_process(tmp_path):
    """Saved with torch.save, loaded with weights_only=True in another interpreter."""
    full, _ = run(*make("fixed"))
    first, epoch = run(*make("fixed"), stop_after=9)
    path = tmp_path / "sift.pt"
    torch.save(first_loader_state("fixed", 9), path)
    code = textwrap.dedent(
        f"""
        import json, sys, torch
        from tests.neuron_sift.dataloader.test_state_dict import make, run
        loader, sampler = make("fixed")
        loader.load_state_dict(torch.load({str(path)!r}, weights_only=True))
        rest, _ = run(loader, sampler, start_epoch={epoch})
        print(json.dumps(rest))
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=LIMIT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    rest = json.loads(done.stdout.strip().splitlines()[-1])
    assert first + rest == full


@pytest.mark.parametrize("device", ["cpu", pytest.param("xla", marks=pytest.mark.xla)], ids=["eager", "xla"])
@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])  # 0.2.0 had no topk
def test_version_1_checkpoints_load_and_resume_exactly(mode, device):
    """A checkpoint written by neuron_sift 0.2.0 (one flat dict, version 1; made by
    make_v1_checkpoints.py with that release, on the CPU) loads into today's composed layout,
    on either backend (on XLA its pending samples go into the device store), and the resumed
    run emits what the uninterrupted 0.2.0 run emitted after it."""
    from tests.neuron_sift.dataloader.make_v1_checkpoints import ids, make

    if device == "xla":
        import torch_xla

        device = torch_xla.device()
    saved = torch.load(Path(__file__).parent / "data" / f"v1_{mode}.pt", weights_only=True)
    assert saved["state"]["version"] == 1
    loader = make(mode, device)
    loader.load_state_dict(saved["state"])
    assert loader.num_pending == saved["state"]["counts"]["num_samples_pending"] > 0
    rest = [ids(b) for b in loader] + [ids(b) for b in loader]
    assert rest == saved["rest"]
    again = loader.state_dict()
    assert again["version"] == 2 and set(again) == {
        "checksum",
        "kind",
        "version",
        "loader",
        "sift_state",
        "counts",
        "delay",
        "epoch",
        "agreement",
        "pending",
    }


def test_unknown_versions_are_refused_naming_the_versions():
    loader, _ = make("fixed")
    state = loader.state_dict()
    state["version"] = 3
    with pytest.raises(ValueError, match=r"version 3; readable versions: 1, 2 \(current 2\)"):
        loader.load_state_dict(state)


def test_a_checkpoint_of_another_batch_size_is_refused_naming_both():
    """In 0.8.0 the first resumed batch failed inside the batch transform (``Batch size 16 does
    not match dimension 0 or 1 ...``), naming neither the checkpoint nor the fix."""
    loader, sampler = make("probabilistic")
    run(loader, sampler, stop_after=3)
    state = loader.state_dict()
    losses = torch.rand(N, generator=torch.Generator().manual_seed(1))
    other = SiftingDataloader(
        sift_config=loader.sift_config,
        orig_dataloader=DataLoader(LossTableDataset(losses), batch_size=2 * B),
        loss_impl=OracleLoss(),
        model=tiny_model(),
    )
    with pytest.raises(
        ValueError, match=f"taken with batch size {B}, this loader's source loader has batch size {2 * B}"
    ):
        other.load_state_dict(state)


def test_a_changed_beta_resumes_with_a_warning_naming_both(caplog):
    """beta shapes only the keep probabilities from then on: the run resumes, and says so."""
    first, sampler = make("probabilistic", beta=1.0)
    done, epoch = run(first, sampler, stop_after=5)
    resumed, sampler = make("probabilistic", beta=2.0)
    with caplog.at_level("WARNING"):
        resumed.load_state_dict(first.state_dict())
    assert any("beta_value=1.0 under beta_value=2.0" in r.getMessage() for r in caplog.records)
    rest, _ = run(resumed, sampler, start_epoch=epoch)
    assert rest and all(len(ids) == B for ids in rest)
