"""The native route (TorchNeuron and every other PyTorch device): backend resolution for
any device type but ``cpu`` and ``xla``, and the step as one ``torch.compile`` graph.

The compiled step is tested on the CPU with inductor (TorchNeuron's "neuron" compiler
backend needs Trainium), counting with dynamo's own counters: one graph per selection
mode, no graph break, no recompilation over 3 epochs that each end with a short batch,
and the uncompiled torch step's selections up to rounding (``assert_same_selections``).
"""

import subprocess
import sys

import pytest
import torch

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.backends import EagerBackend, resolve_backend
from neuron_sift.backends.eager import default_compile_backend
from neuron_sift.engine.sifter import Sifter
from tests.helpers.subprocess_limits import LIMIT_S
from tests.neuron_sift.backends.selections import assert_same_selections, per_epoch_ids
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader

MODES = ["probabilistic", "fixed"]


@pytest.mark.parametrize("device_type", ["cuda", "xpu", "mps", "hpu", "privateuseone"], ids=lambda t: f"type-{t}")
def test_every_device_but_cpu_and_xla_gets_the_torch_step(device_type):
    device = torch.device(device_type)
    backend = resolve_backend(device)
    assert isinstance(backend, EagerBackend) and backend.device == device and not backend.compiles_step
    compiled = resolve_backend(device, "compiled")
    assert compiled.compiles_step and compiled.compile_backend == "inductor"


def test_a_renamed_privateuse1_device_resolves_like_torchneuron():
    """TorchNeuron registers its device as PrivateUse1 named "neuron"; resolution needs no
    Neuron code, and the compiled step defaults to the "neuron" compiler backend."""
    code = (
        "import torch; torch.utils.rename_privateuse1_backend('neuron');"
        "from neuron_sift.backends import resolve_backend, EagerBackend;"
        "b = resolve_backend(torch.device('neuron'));"
        "assert isinstance(b, EagerBackend) and b.device.type == 'neuron', b;"
        "c = resolve_backend(torch.device('neuron:0'), 'compiled');"
        "assert c.compile_backend == 'neuron', c.compile_backend"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_S)
    assert done.returncode == 0, done.stderr[-2000:]


def test_backend_instances_and_their_checks():
    mine = EagerBackend(torch.device("cpu"), compile_step=True, compile_backend="eager")
    assert resolve_backend(torch.device("cpu"), mine) is mine
    with pytest.raises(ValueError, match="runs on cpu, but the model is on cuda"):
        resolve_backend(torch.device("cuda"), mine)
    with pytest.raises(ValueError, match="only used with compile_step=True"):
        EagerBackend(torch.device("cpu"), compile_backend="inductor")
    with pytest.raises(ValueError, match="cannot run on an XLA device"):
        resolve_backend(torch.device("xla"), "compiled")
    assert default_compile_backend(torch.device("cuda")) == "inductor"


def config(mode):
    return RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": 0}},
        selection_mode=mode,
        seed=3,
    )


def selections(losses, mode, backend, epochs=3):
    """Kept ids per emitted batch, one list per epoch, with the torch step (never the host step)."""
    loader = SiftingDataloader(
        sift_config=config(mode),
        orig_dataloader=loss_table_loader(losses, 32),
        loss_impl=OracleLoss(),
        model=torch.nn.Linear(1, 1),
        backend=backend,
    )
    loader.sifter = Sifter(loader.sift_config, loader.backend, loader.ranks, host_step=False)
    return per_epoch_ids(loader, epochs)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_compiled_step_is_one_graph_compiled_once(mode, one_thread):
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    losses = torch.rand(1000, generator=torch.Generator().manual_seed(8))  # 1000 % 32 = 8: a short last batch
    inductor = CompileCounterWithBackend("inductor")
    compiled = selections(losses, mode, EagerBackend(torch.device("cpu"), compile_step=True, compile_backend=inductor))
    assert inductor.frame_count == 1, inductor.frame_count  # one graph, never recompiled
    assert inductor.op_count > 0
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    assert_same_selections(compiled, selections(losses, mode, "eager"), mode)
    assert sum(map(len, compiled)) > 3 * (1000 // 32) // 3


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_compiled_step_on_cuda_selects_what_the_cpu_selects(mode):
    """A native device other than the CPU: the step compiled with inductor on CUDA."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    losses = torch.rand(1000, generator=torch.Generator().manual_seed(8))
    inductor = CompileCounterWithBackend("inductor")
    device = torch.device("cuda")
    loader = SiftingDataloader(
        sift_config=config(mode),
        orig_dataloader=loss_table_loader(losses, 32),
        loss_impl=OracleLoss(),
        model=torch.nn.Linear(1, 1).to(device),
        backend=EagerBackend(device, compile_step=True, compile_backend=inductor),
    )
    assert not loader.sifter._on_host
    got = per_epoch_ids(loader, 3)
    assert inductor.frame_count == 1
    assert_same_selections(got, selections(losses, mode, "eager"), mode)
