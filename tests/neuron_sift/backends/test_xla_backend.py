"""The XLA backend on torch-xla's CPU device: no recompiles, bounded host reads, device batches.

Run in CI with torch-xla 2.9.0 and PJRT_DEVICE=CPU. Counts come from
``torch_xla.debug.metrics``: ``CompileTime`` samples (compilations) and
``TransferFromDeviceTime`` samples (host reads).
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.backends.selections import assert_same_selections, per_epoch_ids
from tests.neuron_sift.backends.xla_probe import CELoss, run_probe  # the probe's loss, the same user code
from tests.neuron_sift.dataloader.fakes import Classifier, OracleLoss, loss_table_loader

pytestmark = pytest.mark.xla  # without torch-xla: deselected by scripts/test.sh, skipped by tests/conftest.py

try:
    import torch_xla
except ImportError:
    torch_xla = None

MODES = ["probabilistic", "fixed"]
# Graphs sifting adds to a training loop, measured by test_graphs_added_by_sifting and
# stated in the README (torch-xla 2.9.0, CPU).
ADDED_GRAPHS_BOUND = {"fixed": 4, "probabilistic": 7}


def config(mode, beta=1.0, history=128, delay=0, seed=0, **scoring):
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=history,
        loss_based_sift_config={"sift_config": {"sift_delay": delay}},
        selection_mode=mode,
        seed=seed,
        **scoring,
    )


def classification_data(n=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x, y)


def sifted(mode, data, batch_size=64, model=None, **cfg):
    device = torch_xla.device()
    model = model if model is not None else Classifier().to(device)
    loader = SiftingDataloader(
        sift_config=config(mode, **cfg),
        orig_dataloader=DataLoader(data, batch_size=batch_size, shuffle=True),
        loss_impl=CELoss(),
        model=model,
    )
    return loader, model, device


def test_import_does_not_load_torch_xla():
    code = "import sys, neuron_sift; import neuron_sift.kernels; sys.exit('torch_xla' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_backend_follows_the_model_device():
    loader, _, _ = sifted("fixed", classification_data(100))
    assert loader.backend.name == "xla"
    assert loader.sifter.state.history.device.type == "xla"
    assert all(t.device.type == "xla" for t in loader.sifter.state.tensors().values())


def probe(mode, source="dataloader", epochs=4):
    """Counts from a fresh process (compilations are cached process-wide)."""
    selection = ["--mode", "plain"] if mode == "plain" else ["--mode", "per-batch", "--selection", mode]
    return run_probe(*selection, "--epochs", str(epochs), "--source", source)


@pytest.fixture(scope="module")
def probes():
    """One fresh-process run per loop: plain DataLoader, and sifted in each mode and source."""
    return {
        (mode, source): probe(mode, source)
        for mode, source in [
            ("plain", "dataloader"),
            ("fixed", "dataloader"),
            ("probabilistic", "dataloader"),
            ("fixed", "mp"),
            ("probabilistic", "mp"),
        ]
    }


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dataloader", "mp"])
@pytest.mark.parametrize("mode", MODES)
def test_no_recompilation_after_first_epoch(probes, mode, source):
    """1000 samples, batch 64: a short last batch of 40 every epoch; 4 epochs of training."""
    run = probes[(mode, source)]
    compiles = [e["compiles"] for e in run["epochs"]]
    assert compiles[0] > 0
    assert compiles[1:] == [compiles[0]] * 3, compiles
    assert run["fallbacks"] == []
    assert run["counts"]["num_source_batches"] == 4 * 16


@pytest.mark.slow
def test_graphs_added_by_sifting(probes):
    """Sifting adds a small, fixed number of graphs to a training loop (README states it)."""
    baseline = probes[("plain", "dataloader")]["epochs"][-1]["compiles"]
    added = {m: probes[(m, "dataloader")]["epochs"][-1]["compiles"] - baseline for m in MODES}
    print("graphs added by sifting:", added, "baseline:", baseline)
    assert 0 < added["fixed"] <= ADDED_GRAPHS_BOUND["fixed"], added
    assert 0 < added["probabilistic"] <= ADDED_GRAPHS_BOUND["probabilistic"], added


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dataloader", "mp"])
@pytest.mark.parametrize("mode", MODES)
def test_host_reads_per_source_batch(probes, mode, source):
    run = probes[(mode, source)]
    scored = run["counts"]["num_source_batches"]
    reads = run["epochs"][-1]["reads"]
    if mode == "fixed":
        assert reads == 0
    else:
        assert 0 < reads <= scored


@pytest.mark.parametrize("mode", MODES)
def test_emitted_batches_stay_on_device(mode):
    loader, _, _ = sifted(mode, classification_data(300))
    batches = list(loader)
    assert batches
    for x, y in batches:
        assert x.device.type == "xla" and y.device.type == "xla"
        assert x.shape == (64, 10) and y.shape == (64,)


def xla_oracle_loader(losses, mode, batch_size=32, beta=1.0, seed=3, source=None):
    device = torch_xla.device()
    model = torch.nn.Linear(1, 1).to(device)
    return SiftingDataloader(
        sift_config=config(mode, beta=beta, history=64, seed=seed),
        orig_dataloader=source if source is not None else loss_table_loader(losses, batch_size),
        loss_impl=OracleLoss(),
        model=model,
    )


def eager_oracle_loader(losses, mode, batch_size=32, beta=1.0, seed=3):
    return SiftingDataloader(
        sift_config=config(mode, beta=beta, history=64, seed=seed),
        orig_dataloader=loss_table_loader(losses, batch_size),
        loss_impl=OracleLoss(),
        model=torch.nn.Linear(1, 1),
    )


def ids_of(loader, epochs=2):
    return [ids.cpu().tolist() for _ in range(epochs) for ids, _ in loader]


@pytest.mark.parametrize("mode", MODES)
def test_padding_is_never_kept_or_recorded(mode):
    """The short last batch (4 of 32) is padded by repeating its last sample (id 99), whose
    loss is the largest: recorded or kept as padding, it would show many times over."""
    losses = torch.rand(100, generator=torch.Generator().manual_seed(4))  # 100 % 32 = 4
    losses[99] = 5.0
    loader = xla_oracle_loader(losses, mode, beta=0.25)
    batches = ids_of(loader, epochs=3)
    m = loader.metrics()
    assert m["device_num_scored"] == 300  # padding rows never counted
    assert m["history_fill"] == 64
    assert m["device_num_kept"] == loader.counts.num_orig_samples_kept
    flat = [i for b in batches for i in b] + loader.pending_batch().to_user()[0].cpu().tolist()
    assert all(0 <= i < 100 for i in flat)
    # At most once per epoch, never as padding; probabilistic mode keeps the top loss surely.
    assert flat.count(99) == 3 if mode == "probabilistic" else 1 <= flat.count(99) <= 3
    assert len(flat) == loader.counts.num_orig_samples_kept
    # The history holds the last 64 real losses, each as often as it was scored: id 99 once.
    hist = loader.sifter.state.history.cpu()
    assert int((hist == 5.0).sum()) == 1
    assert all(bool((losses == v).any()) for v in hist)


@pytest.mark.parametrize("mode", MODES)
def test_same_selections_as_eager_backend(mode):
    """The hash RNG and the same math make both backends select the same samples (up to
    decisions within float rounding of their threshold: ``assert_same_selections``)."""
    losses = torch.rand(1000, generator=torch.Generator().manual_seed(6))
    got = per_epoch_ids(xla_oracle_loader(losses, mode), 2)
    assert_same_selections(got, per_epoch_ids(eager_oracle_loader(losses, mode), 2), mode)


@pytest.mark.parametrize("mode", MODES)
def test_same_seed_same_selections(mode):
    losses = torch.rand(500, generator=torch.Generator().manual_seed(7))
    a = ids_of(xla_oracle_loader(losses, mode, seed=11))
    assert a == ids_of(xla_oracle_loader(losses, mode, seed=11))
    assert a != ids_of(xla_oracle_loader(losses, mode, seed=12))


@pytest.mark.slow
def test_backends_agree_in_distribution_on_a_real_model():
    """Training the same model on both backends: kept shares within 3 points of each other
    and of 1 / (1 + beta); both keep samples whose loss is above the average."""
    data = classification_data(3000, seed=1)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    results = {}
    for name, device in [("eager", torch.device("cpu")), ("xla", torch_xla.device())]:
        torch.manual_seed(0)
        model = Classifier().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = SiftingDataloader(
            sift_config=config("probabilistic", beta=2.0, history=256),
            orig_dataloader=DataLoader(data, batch_size=50, shuffle=True),
            loss_impl=CELoss(),
            model=model,
        )
        kept_losses, all_losses = [], []
        for _ in range(2):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                with torch.no_grad():
                    kept_losses.append(ce(model(x), y).mean().cpu())
                    xa, ya = data.tensors[0].to(device), data.tensors[1].to(device)
                    all_losses.append(ce(model(xa), ya).mean().cpu())
                loss = ce(model(x), y).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if device.type == "xla":
                    torch_xla.sync()
        c = loader.counts
        results[name] = {
            "share": c.num_orig_samples_kept / c.num_orig_samples_seen,
            "kept_over_mean": float(torch.stack(kept_losses).mean() / torch.stack(all_losses).mean()),
        }
    for r in results.values():
        assert abs(r["share"] - 1 / 3) < 0.03, results
        assert r["kept_over_mean"] > 1.05, results
    assert abs(results["eager"]["share"] - results["xla"]["share"]) < 0.03, results


@pytest.mark.parametrize("mode", MODES)
def test_composes_with_mp_device_loader(mode):
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    losses = torch.rand(200)
    source = pl.MpDeviceLoader(loss_table_loader(losses, 32), device)
    loader = xla_oracle_loader(losses, mode, source=source)
    assert loader.batch_size == 32
    batches = list(loader)
    assert batches and all(ids.device.type == "xla" and ids.shape == (32,) for ids, _ in batches)
    if mode == "fixed":
        assert len(loader) == len(list(loader))


@pytest.mark.parametrize("mode", MODES)
def test_graph_extraction_with_zero_reads_still_finishes(mode, monkeypatch):
    """neuron_parallel_compile: graphs are stubs and every value read back is zero."""
    monkeypatch.setenv("NEURON_EXTRACT_GRAPHS_ONLY", "1")
    losses = torch.rand(330)
    loader = xla_oracle_loader(losses, mode, beta=1.0)
    monkeypatch.setattr(loader.backend, "to_host", lambda t: torch.zeros(t.shape, dtype=t.dtype))
    batches = [b for _ in range(2) for b in loader]
    # Batches are still emitted (so the training graphs get extracted), in full shape.
    assert len(batches) >= 2 * (330 // 2 // 32) - 1
    assert all(ids.shape == (32,) for ids, _ in batches)


@pytest.mark.parametrize("mode", MODES)
def test_string_fields_need_host_indices_but_work(mode):
    class WithText(torch.utils.data.Dataset):
        def __len__(self):
            return 96

        def __getitem__(self, i):
            return {"id": torch.tensor(i), "text": f"t{i}", "loss": torch.rand(())}

    class DictLoss:
        def loss(self, model, transformed_batch, original_batch=None):
            return original_batch["loss"].to(next(model.parameters()).device)

    device = torch_xla.device()
    loader = SiftingDataloader(
        sift_config=config(mode, beta=0.5),
        orig_dataloader=DataLoader(WithText(), batch_size=16),
        loss_impl=DictLoss(),
        model=torch.nn.Linear(1, 1).to(device),
    )
    emitted = []
    for batch in loader:
        assert batch["text"] == [f"t{i}" for i in batch["id"].cpu().tolist()]
        emitted += batch["id"].cpu().tolist()
    assert len(emitted) >= 32 and len(set(emitted)) == len(emitted) == loader.counts.num_samples_emitted


def test_nonfinite_losses_on_xla_are_kept_and_not_recorded():
    losses = torch.rand(128)
    losses[[5, 77]] = float("nan")
    loader = xla_oracle_loader(losses, "probabilistic", beta=3.0)
    kept = [i for b in ids_of(loader, epochs=1) for i in b] + (
        loader.pending_batch().to_user()[0].cpu().tolist() if loader.pending_batch() is not None else []
    )
    assert 5 in kept and 77 in kept
    assert torch.isfinite(loader.sifter.state.history.cpu()).all()
    assert loader.metrics()["device_num_nonfinite"] == 2


@pytest.mark.xla
def test_metrics_snapshot_counts_nonfinite_losses_of_unread_batches():
    """Fixed mode on XLA reads no selection back, so only the device counter sees the
    non-finite losses; the shared metrics snapshot and checkpoints report that count."""
    from neuron_sift.metrics import collect_metrics

    losses = torch.rand(128)
    losses[[5, 77]] = float("nan")
    loader = xla_oracle_loader(losses, "fixed", beta=1.0)
    ids_of(loader, epochs=1)
    assert loader.metrics()["num_nonfinite_losses"] == 2
    assert collect_metrics(loader).num_nonfinite_losses == 2
    assert loader.state_dict()["counts"]["num_nonfinite_losses"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("save_on,load_on", [("xla", "xla"), ("cpu", "xla"), ("xla", "cpu")])
def test_resume_across_backends(mode, save_on, load_on):
    """Stopped after emitted batch k, saved, loaded on the same or the other backend: the
    rest of the run equals the uninterrupted eager run."""
    from tests.neuron_sift.dataloader.test_state_dict import make, roundtrip, run

    def device(name):
        return torch_xla.device() if name == "xla" else torch.device("cpu")

    full, _ = run(*make(mode))
    for stop in (1, 7, 15):
        loader, sampler = make(mode, device=device(save_on))
        first, epoch = run(loader, sampler, stop_after=stop)
        state = roundtrip(loader.state_dict())
        resumed, sampler2 = make(mode, device=device(load_on))
        resumed.load_state_dict(state)
        rest, _ = run(resumed, sampler2, start_epoch=epoch)
        assert first + rest == full, (stop, save_on, load_on)


def checkpoint_compiles(mode):
    """Compilations added by ``state_dict()`` at every step and by resuming, after warm-up.

    Epoch 1 warms up without checkpoints; epochs 2-3 call ``state_dict()`` after every
    batch (the pending count takes many values); then fresh loaders resume from several of
    those checkpoints (different pending counts) and finish their epoch. Run in a fresh
    process: compilations are cached process-wide, so other tests would hide new graphs.
    """
    import torch_xla.debug.metrics as met

    def compiles():
        data = met.metric_data("CompileTime")
        return data[0] if data else 0

    data = classification_data(1000)  # batch 64: a short last batch of 40

    def build():
        torch.manual_seed(0)
        loader, _, _ = sifted(mode, data, batch_size=64)
        return loader

    loader = build()
    for _ in loader:
        pass
    warm = compiles()
    states = []
    for _ in range(2):
        for _ in loader:
            states.append(loader.state_dict())
    after_saving = compiles()
    pending = sorted({s["counts"]["num_samples_pending"] for s in states})
    by_pending = {s["counts"]["num_samples_pending"]: s for s in states}
    for state in list(by_pending.values())[:4]:
        resumed = build()
        resumed.load_state_dict(state)
        for _ in resumed:
            pass
    return {
        "saving": after_saving - warm,
        "resuming": compiles() - after_saving,
        "pending_counts": pending,
        "checkpoints": len(states),
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_checkpoints_and_resume_add_no_compilation(mode):
    code = (
        "import json; from tests.neuron_sift.backends.test_xla_backend import checkpoint_compiles; "
        f"print(json.dumps(checkpoint_compiles({mode!r})))"
    )
    env = dict(os.environ, PJRT_DEVICE="CPU")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["pending_counts"]) >= 4, out  # a graph per pending count (or per restored value) would show
    assert out["saving"] == 0 and out["resuming"] == 0, out


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_sorted_percentile_path_inside_the_loader(mode, monkeypatch):
    """B x H above the XLA threshold: the loader's step ranks with the sort-based (merge)
    percentile on the device, and selects what the eager loader selects (up to rounding)."""
    from neuron_sift.kernels import percentile

    b, h = 64, (percentile.SORTED_PERCENTILE_MIN_CELLS_XLA // 64) + 1
    calls = []
    real = percentile.percentile_rank_sorted

    def spy(losses, history, *args, **kw):
        calls.append(history.device.type)
        return real(losses, history, *args, **kw)

    monkeypatch.setattr(percentile, "percentile_rank_sorted", spy)
    losses = torch.rand(640, generator=torch.Generator().manual_seed(8))

    def loader(device):
        return SiftingDataloader(
            sift_config=config(mode, history=h, seed=2),
            orig_dataloader=loss_table_loader(losses, b),
            loss_impl=OracleLoss(),
            model=torch.nn.Linear(1, 1).to(device),
        )

    on_xla = per_epoch_ids(loader(torch_xla.device()), 2)
    assert "xla" in calls
    assert on_xla[0] and on_xla[1]
    assert_same_selections(on_xla, per_epoch_ids(loader(torch.device("cpu")), 2), mode)


def test_bfloat16_scoring_runs_on_the_xla_device_and_inference_mode_is_refused():
    """``scoring_precision="bfloat16"`` autocasts the scoring forward on the XLA device (the
    batches keep coming, the model stays float32); ``scoring_inference_mode`` is refused
    there with what to do (torch-xla's lazy tensors cannot be inference tensors)."""
    data = classification_data(n=256)
    loader, model, _ = sifted("fixed", data, scoring_precision="bfloat16")
    assert sum(int(batch[0].shape[0]) for batch in loader) > 0
    assert next(model.parameters()).dtype == torch.float32
    loader, _, _ = sifted("fixed", data, scoring_inference_mode=True)
    with pytest.raises(ValueError, match="scoring_inference_mode=True is not supported on torch-xla"):
        next(iter(loader))
