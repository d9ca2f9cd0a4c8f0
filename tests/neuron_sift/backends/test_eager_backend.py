"""The eager backend on every device this machine has: CPU always, CUDA where present.

The CUDA cases carry the ``cuda`` marker: scripts/test.sh deselects them on a machine without
CUDA (CI), and a direct pytest run there skips them with that reason (tests/conftest.py); they
were run on an NVIDIA H200 (see the README's verification table).
"""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import LossOutputException, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.backends import resolve_backend
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.cuda),
]
MODES = ["probabilistic", "fixed"]


def config(mode, beta=1.0, history=128, seed=0):
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=history,
        loss_based_sift_config={"sift_config": {"sift_delay": 0}},
        selection_mode=mode,
        seed=seed,
    )


def oracle_ids(device, mode, losses, epochs=2, torch_step=False):
    loader = SiftingDataloader(
        sift_config=config(mode),
        orig_dataloader=loss_table_loader(losses, 32),
        loss_impl=OracleLoss(),
        model=torch.nn.Linear(1, 1).to(device),
    )
    if torch_step:  # the torch step on the CPU instead of the host kernels
        from neuron_sift.engine.sifter import Sifter

        loader.sifter = Sifter(loader.sift_config, loader.backend, loader.ranks, host_step=False)
    out = [ids.tolist() for _ in range(epochs) for ids, _ in loader]
    return out, loader


@pytest.mark.parametrize("device", DEVICES)
def test_backend_and_state_follow_the_model(device):
    _, loader = oracle_ids(device, "fixed", torch.rand(64))
    assert loader.backend.name == "eager"
    assert all(t.device.type == device for t in loader.sifter.state.tensors().values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_same_selections_on_every_device(device, mode):
    """Against another implementation: on the CPU the loader runs the host kernels, so the
    reference is the torch step (on the CPU); on CUDA the torch step runs there, so the
    reference is the host kernels."""
    losses = torch.rand(1000, generator=torch.Generator().manual_seed(9))
    reference, ref_loader = oracle_ids("cpu", mode, losses, torch_step=device == "cpu")
    dev_ids, loader = oracle_ids(device, mode, losses)
    assert loader.sifter._on_host != ref_loader.sifter._on_host  # two implementations
    assert dev_ids == reference and len(dev_ids) > 20
    c = loader.counts
    assert c.num_orig_samples_seen == c.num_orig_samples_kept + c.num_orig_samples_sifted


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_trains_a_real_model(device, mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)).to(device)

    class CE:
        def loss(self, model, transformed_batch, original_batch=None):
            xb, yb = [t.to(device) for t in original_batch]
            return torch.nn.functional.cross_entropy(model(xb), yb, reduction="none")

    loader = SiftingDataloader(
        sift_config=config(mode, beta=1.0),
        orig_dataloader=DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True),
        loss_impl=CE(),
        model=model,
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = (model(x.to(device)).argmax(1).cpu() == y).float().mean().item()
    assert acc > 0.9
    m = loader.metrics()
    assert abs(m["observed_kept_share"] - 0.5) < 0.05
    assert "kept_share" not in m  # 0.5.0's alias of observed_kept_share is gone


@pytest.mark.parametrize("device", DEVICES)
def test_loss_on_another_device_is_an_error(device):
    other = "meta" if device == "cpu" else "cpu"

    class Elsewhere:
        def loss(self, model, transformed_batch, original_batch=None):
            return original_batch[1].to(other)

    loader = SiftingDataloader(
        sift_config=config("probabilistic"),
        orig_dataloader=loss_table_loader(torch.rand(16), 8),
        loss_impl=Elsewhere(),
        model=torch.nn.Linear(1, 1).to(device),
    )
    with pytest.raises(LossOutputException, match=f"on {other}"):
        list(loader)


def test_backend_names_are_checked():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend(torch.device("cpu"), "tpu")
    with pytest.raises(ValueError, match="needs the model on an XLA device"):
        resolve_backend(torch.device("cpu"), "xla")
