"""Fault injection on both backends: errors surface with context, nothing is lost, the
loader can be iterated again afterwards, and nothing hangs."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.helpers.subprocess_limits import LIMIT_S


def _xla_device():
    import torch_xla

    return torch_xla.device()


BACKENDS = [
    pytest.param("cpu", id="eager"),
    pytest.param("xla", id="xla", marks=pytest.mark.xla),
]
MODES = ["probabilistic", "fixed"]


def device_of(name):
    if name == "xla":
        pytest.importorskip("torch_xla", reason="torch-xla not installed (CI installs it)")
        return _xla_device()
    return torch.device("cpu")


class Faulty(Dataset):
    """Sample i = (i, loss_i); raises at index ``bad`` while ``armed``."""

    def __init__(self, n=200, bad=None):
        self.losses = torch.rand(n, generator=torch.Generator().manual_seed(0))
        self.bad = bad
        self.armed = True

    def __len__(self):
        return len(self.losses)

    def __getitem__(self, i):
        if self.armed and i == self.bad:
            raise ValueError(f"corrupt record {i}")
        return torch.tensor(i), self.losses[i]


class ScriptedLoss:
    """Oracle loss with injectable faults: a NaN batch, or an exception on call ``fail_on``."""

    def __init__(self, nan_call=None, fail_on=None, exc=None):
        self.calls = 0
        self.nan_call, self.fail_on, self.exc = nan_call, fail_on, exc

    def loss(self, model, transformed_batch, original_batch=None):
        self.calls += 1
        model(torch.zeros(1, 1, device=next(model.parameters()).device))  # a real forward
        if self.fail_on is not None and self.calls == self.fail_on:
            raise self.exc
        losses = original_batch[1].to(next(model.parameters()).device)
        if self.calls == self.nan_call:
            losses = torch.full_like(losses, float("nan"))
        return losses


def build(backend, mode, dataset, loss, batch_size=16):
    model = torch.nn.Linear(1, 1).to(device_of(backend))
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=32,
            loss_based_sift_config={"sift_config": {"sift_delay": 0}},
            selection_mode=mode,
            seed=0,
        ),
        orig_dataloader=DataLoader(dataset, batch_size=batch_size),
        loss_impl=loss,
        model=model,
    )
    return loader, model


def consistent(loader):
    c = loader.counts
    assert c.num_orig_samples_seen == c.num_orig_samples_kept + c.num_orig_samples_sifted
    assert c.num_orig_samples_kept == c.num_samples_emitted + c.num_samples_pending + c.num_samples_dropped
    assert c.num_samples_dropped == 0 and loader.num_pending == c.num_samples_pending


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_source_loader_raising_mid_epoch(backend, mode):
    data = Faulty(bad=100)  # inside source batch 6
    loader, _ = build(backend, mode, data, ScriptedLoss())
    got = []
    with pytest.raises(ValueError, match="corrupt record 100") as info:
        for ids, _ in loader:
            got.append(ids)
    assert any("source batch 6" in n for n in getattr(info.value, "__notes__", []))
    assert loader.counts.num_orig_samples_seen == 6 * 16
    consistent(loader)
    data.armed = False
    again = list(loader)  # a new epoch runs to the end
    assert again and loader.counts.num_orig_samples_seen == 6 * 16 + 200
    consistent(loader)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_returning_nan_for_a_whole_batch(backend, mode):
    loader, _ = build(backend, mode, Faulty(), ScriptedLoss(nan_call=3))
    emitted = [i for _ in range(1) for ids, _ in loader for i in ids.cpu().tolist()]
    pending = loader.pending_batch()
    kept = emitted + ([] if pending is None else pending.to_user()[0].cpu().tolist())
    nan_rows = list(range(32, 48))  # source batch 2 (the third call)
    if mode == "probabilistic":
        assert all(i in kept for i in nan_rows)  # all kept: training must see them
    else:
        assert sum(i in kept for i in nan_rows) == 8  # exactly k, all of them non-finite
    assert torch.isfinite(loader.sifter.state.history.cpu()).all()
    assert loader.metrics()["device_num_nonfinite"] == 16
    consistent(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_switched_to_eval_and_back(backend):
    loader, model = build(backend, "probabilistic", Faulty(), ScriptedLoss())
    it = iter(loader)
    model.train()
    next(it)
    assert model.training
    model.eval()
    next(it)
    assert not model.training  # scoring restored the user's eval mode
    model.train()
    rest = list(it)
    assert model.training and rest
    consistent(loader)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_keyboard_interrupt_during_scoring(backend, mode):
    loss = ScriptedLoss(fail_on=4, exc=KeyboardInterrupt())
    loader, model = build(backend, mode, Faulty(), loss)
    model.train()
    with pytest.raises(KeyboardInterrupt):
        list(loader)
    assert model.training and torch.is_grad_enabled()
    assert loader.counts.num_orig_samples_seen == 3 * 16  # the interrupted batch is not counted
    consistent(loader)
    loss.fail_on = None
    assert list(loader)
    consistent(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_loss_error_keeps_type_traceback_and_context(backend):
    loader, _ = build(backend, "fixed", Faulty(), ScriptedLoss(fail_on=2, exc=IndexError("bad label")))
    with pytest.raises(IndexError, match="bad label") as info:
        list(loader)
    assert any("scoring source batch 1" in n for n in info.value.__notes__)
    assert info.traceback[-1].name == "loss"  # raised where the user raised it


def test_crashing_worker_surfaces_and_does_not_hang():
    """A DataLoader worker killed mid-epoch: the error reaches the training loop."""
    code = textwrap.dedent(
        """
        import os, torch
        from torch.utils.data import DataLoader, Dataset
        from neuron_sift import SiftingDataloader

        class Dying(Dataset):
            def __len__(self): return 400
            def __getitem__(self, i):
                if i == 150: os._exit(3)
                return torch.tensor(i), torch.rand(())

        class L:
            def loss(self, model, tb, ob=None): return ob[1]

        loader = SiftingDataloader(
            sift_config={"beta_value": 1.0, "loss_history_length": 16,
                         "loss_based_sift_config": {"sift_config": {"sift_delay": 0}}},
            orig_dataloader=DataLoader(Dying(), batch_size=10, num_workers=2),
            loss_impl=L(), model=torch.nn.Linear(1, 1))
        try:
            for _ in loader: pass
        except Exception as e:  # RuntimeError from DataLoader's watchdog, or the broken pipe itself
            notes = getattr(e, "__notes__", [])
            print("SURFACED:", type(e).__name__, "|", notes, flush=True)
            os._exit(0)  # skip DataLoader's teardown of the dead worker, which may raise again
        raise SystemExit("no error")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_S)
    both = done.stdout + done.stderr
    # DataLoader reports a dead worker from a SIGCHLD handler, which can raise its
    # RuntimeError a second time, anywhere, even inside the except block above: either way
    # the error reached the training loop, with the batch named, and the process ended.
    assert "SURFACED:" in done.stdout or "exited unexpectedly" in done.stderr, both[-3000:]
    assert "while loading source batch" in both, both[-3000:]
    assert "no error" not in done.stderr


def test_worker_exception_keeps_its_type():
    data = Faulty(bad=57)
    loader = SiftingDataloader(
        sift_config={
            "beta_value": 1.0,
            "loss_history_length": 16,
            "loss_based_sift_config": {"sift_config": {"sift_delay": 0}},
        },
        orig_dataloader=DataLoader(data, batch_size=10, num_workers=2),
        loss_impl=ScriptedLoss(),
        model=torch.nn.Linear(1, 1),
    )
    with pytest.raises(ValueError, match="corrupt record 57") as info:
        list(loader)
    assert any("source batch 5" in n for n in info.value.__notes__)


def test_nothing_is_written_to_disk(tmp_path, monkeypatch, caplog):
    """With every logging option on, the library opens no file and no socket, by any route:
    ``open``, ``io.open`` (which pathlib uses), ``os.open``, temporary files, sockets."""
    import builtins
    import io
    import logging
    import os
    import socket
    import tempfile

    monkeypatch.chdir(tmp_path)
    loader, _ = build("cpu", "probabilistic", Faulty(), ScriptedLoss())
    loader.log_batch_data = True
    opened = []

    def refuse(name):
        def no(*a, **k):
            opened.append((name, a))
            raise AssertionError(f"neuron_sift called {name}{a}")

        return no

    with caplog.at_level(logging.INFO, logger="neuron_sift"):
        with monkeypatch.context() as m:
            for owner, name in [
                (builtins, "open"),
                (io, "open"),
                (os, "open"),
                (os, "mkdir"),
                (os, "makedirs"),
                (tempfile, "mkstemp"),
                (tempfile, "NamedTemporaryFile"),
                (socket, "socket"),
            ]:
                m.setattr(owner, name, refuse(f"{owner.__name__}.{name}"))
            emitted = list(loader)
    assert emitted and opened == []
    assert list(tmp_path.iterdir()) == []
    text = caplog.text
    assert "relevance_values: [" in text and "kept_indices: [" in text
    assert "emitted_batch" not in text  # contents only with log_batch_contents=True


def test_batch_contents_are_logged_only_on_request(caplog):
    import logging

    loader, _ = build("cpu", "probabilistic", Faulty(), ScriptedLoss())
    loader.log_batch_contents = True
    with caplog.at_level(logging.INFO, logger="neuron_sift"):
        list(loader)
    assert "emitted_batch: [tensor([" in caplog.text
