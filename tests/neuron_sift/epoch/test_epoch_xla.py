"""Epoch-level sifting on torch-xla's CPU device (either score table): device-resident tables, no recompilation
after the second epoch (short last batches included), one host read per sifted epoch, no
aten fallbacks, exact resume. Counts from ``torch_xla.debug.metrics`` in a fresh process."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

try:  # without torch-xla these tests are deselected by scripts/test.sh, skipped by tests/conftest.py
    import torch_xla
except ImportError:
    torch_xla = None

from neuron_sift import EpochSiftingDataloader  # noqa: E402
from tests.helpers.state_roundtrip import roundtrip  # noqa: E402
from tests.neuron_sift.backends.xla_probe import run_probe  # noqa: E402
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle, oracle_loss  # noqa: E402

pytestmark = pytest.mark.xla


def probe(*args):
    """Counts from a fresh process (compilations are cached process-wide): the loop both
    modes' probes share, 5 epochs (warm-up, 3 sifted, 1 annealing)."""
    return run_probe("--epochs", "5", *args)


@pytest.fixture(scope="module")
def probes():
    return {
        "plain": probe("--mode", "plain"),
        "dataloader": probe("--mode", "epoch"),
        "mp": probe("--mode", "epoch", "--source", "mp"),
        "budget": probe("--mode", "epoch", "--budget", "0.37"),
        "sharded": probe("--mode", "epoch", "--score-table", "sharded"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("run", ["dataloader", "mp", "budget", "sharded"])
def test_graph_count_is_flat_after_the_second_epoch(probes, run):
    """1000 samples, batch 64: full epochs end with a short batch of 40; 5 epochs (warm-up,
    3 sifted, 1 annealing); the budget run's sifted epochs end with a short batch of 50."""
    r = probes[run]
    compiles = [e["compiles"] for e in r["epochs"]]
    assert [e["kind"] for e in r["epochs"]] == ["warmup", "sift", "sift", "sift", "anneal"]
    assert compiles[2:] == [compiles[1]] * 3, compiles
    assert r["fallbacks"] == []
    assert r["table_device"].startswith("xla")
    assert r["metrics"]["scores_recorded"] == 1000


@pytest.mark.slow
@pytest.mark.parametrize("run", ["dataloader", "mp", "budget", "sharded"])
def test_one_host_read_per_sifted_epoch_and_none_per_step(probes, run):
    reads = [e["reads"] for e in probes[run]["epochs"]]
    assert reads == [0, 1, 2, 3, 3], reads  # warm-up and annealing plan without scores


@pytest.mark.slow
def test_graphs_added_to_the_training_loop(probes):
    """The scatter and gather join the training step's own graph; the per-epoch read of the
    score table is one more graph (and the budget's short sifted batch one more)."""
    plain = probes["plain"]["epochs"][-1]["compiles"]
    assert probes["dataloader"]["epochs"][-1]["compiles"] - plain == 1
    assert probes["budget"]["epochs"][-1]["compiles"] - plain == 2
    assert probes["sharded"]["epochs"][-1]["compiles"] - plain == 1  # slots instead of ids: the same graphs


def xla_loader(cfg):
    return EpochSiftingDataloader(cfg, DataLoader(IdDataset(150), batch_size=16, shuffle=True), num_epochs=4)


def train(loader, epochs, stop=None):
    device = torch_xla.device()
    seen = []
    for _ in range(epochs):
        for x, _y in loader:
            seen.append(ids_of(x))
            out = loader.weighted_loss(oracle_loss(x).to(device))
            assert out.device.type == "xla"
            torch_xla.sync()
            if stop is not None and len(seen) == stop:
                return seen
    return seen


def test_tables_live_on_the_device_and_scores_are_paired():
    loader = xla_loader({**PRUNE_FROM_THE_START, "seed": 1})
    seen = train(loader, 2)
    assert loader.tables._dev_scores.device.type == "xla"
    assert loader.backend.name == "xla"
    scores = loader.tables.snapshot()
    ids = torch.tensor(sorted({i for b in seen for i in b}))
    assert torch.allclose(scores[ids], oracle(ids))


def test_smoothed_and_batch_level_scores_on_the_device_are_the_hosts():
    """The device path of the score writes (a gather of the previous scores, the moving average,
    the scatter) records what the host path records."""

    def scores(device):
        dl = DataLoader(IdDataset(150), batch_size=16, shuffle=True)
        loader = EpochSiftingDataloader({"seed": 1, "score_smoothing": 0.25, "warmup_epochs": 3}, dl, num_epochs=3)
        for epoch in range(3):
            for x, _y in loader:
                losses = oracle_loss(x).to(device) * (epoch + 1)
                if epoch == 1:
                    loader.weighted_batch_loss(losses.mean())
                else:
                    loader.weighted_loss(losses)
                if device.type == "xla":
                    torch_xla.sync()
        return loader.tables.snapshot()

    torch.testing.assert_close(scores(torch_xla.device()), scores(torch.device("cpu")))


def on_cpu(state):
    """A model's or optimizer's state with its tensors on the CPU (to save it)."""
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: on_cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [on_cpu(v) for v in state]
    return state


def xla_model():
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(2, 3)
    with torch.no_grad():
        model.weight.copy_(0.1 * torch.randn(3, 2, generator=g))
        model.bias.zero_()
    model = model.to(torch_xla.device())
    return model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)


def train_model(loader, model, opt, epochs, stop=None):
    """A linear classifier trained on the device; (ids, the value weighted_loss returned) per step."""
    device = torch_xla.device()
    log = []
    while loader.epoch < epochs or loader.resuming:
        for x, y in loader:
            ids = ids_of(x)
            out = loader.weighted_loss(F.cross_entropy(model(x.to(device) / 150), y.to(device), reduction="none"))
            opt.zero_grad()
            out.backward()
            opt.step()
            torch_xla.sync()
            log.append((ids, out.detach().cpu()))
            if stop is not None and len(log) == stop:
                return log
    return log


def test_exact_resume_on_xla():
    """A model training on the device, stopped in the first sifted epoch and resumed with
    its optimizer into fresh objects: the same batches, weighted losses and parameters."""
    cfg = {**PRUNE_FROM_THE_START, "seed": 3, "kept_share": 0.5}
    full_model, full_opt = xla_model()
    full = train_model(xla_loader(cfg), full_model, full_opt, 4)
    a, (model, opt) = xla_loader(cfg), xla_model()
    first = train_model(a, model, opt, 4, stop=12)  # 10 batches of the warm-up, 2 of the sifted epoch
    assert a.plan.kind == "sift" and a.state_dict()["in_progress"]
    state = roundtrip({"loader": a.state_dict(), "model": on_cpu(model.state_dict()), "opt": on_cpu(opt.state_dict())})
    b, (model, opt) = xla_loader(cfg), xla_model()
    b.load_state_dict(state["loader"])
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    log = first + train_model(b, model, opt, 4)
    assert b.tables._dev_scores.device.type == "xla"
    assert [ids for ids, _ in log] == [ids for ids, _ in full]
    assert all(torch.equal(out, ref) for (_, out), (_, ref) in zip(log, full))
    assert all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(model.parameters(), full_model.parameters()))


def test_the_backend_keyword():
    loader = EpochSiftingDataloader({}, DataLoader(IdDataset(10), batch_size=5), backend="xla")
    it = iter(loader)
    x, y = next(it)
    with pytest.raises(ValueError, match="backend='xla' needs"):
        loader.weighted_loss(oracle_loss(x))


def test_the_xla_backend_answers_the_epoch_loaders_device_questions():
    """Tables on the device (not held on the host), and any XLA device is the loader's."""
    from neuron_sift.backends import resolve_backend

    device = torch_xla.device()
    backend = resolve_backend(device)
    assert not backend.holds_on_host and backend.sort_method == "merge"
    assert backend.same_device(device, torch.device("xla"))
