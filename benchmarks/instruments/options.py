"""The command-line options the suite and the standalone measurements share: which clock
times a run and how many threads torch uses.

Defined once so that ``--clock cpu`` and ``--threads`` mean the same in every script and
in every record they write (the records carry the option's value, not its definition).

Which clock by default (``default_clock``): on the host's CPU the process's CPU time, since
a shared machine's other load stretches the wall-clock of a run there but not its CPU
time, so a loaded machine prints the same speedups as an idle one; on an accelerator the
wall-clock, since the host's CPU time there leaves out the device's work.
"""

import argparse
import time
from collections.abc import Callable

import torch

# --clock: wall-clock, or the process's CPU seconds over the same interval (all threads,
# the XLA CPU device's included), which a shared machine's other load disturbs much less.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def add_clock(p: argparse.ArgumentParser, help: str, default: str | None = "wall") -> None:
    """``--clock``; ``default=None`` leaves the choice to the run (``default_clock``)."""
    p.add_argument("--clock", choices=tuple(CLOCKS), default=default, help=help)


def runs_on_host_cpu(device: str) -> bool:
    """Whether a device description names the host's CPU rather than an accelerator:
    ``environment.setup_backend``'s ``device_desc`` (and so a record's ``device``) is
    ``"cpu (<processor>)"`` for eager and ``"xla:CPU"`` for torch-xla's CPU device;
    ``"xla:NEURON"``, ``"xla:CUDA"``, ``"cuda:0"`` name accelerators."""
    if not isinstance(device, str) or not device:
        raise ValueError(f"a device description is a non-empty string, got {device!r}")
    return device == "xla:CPU" or device == "cpu" or device.startswith("cpu ")


def default_clock(devices: list[str]) -> str:
    """The clock runs on ``devices`` are timed on when ``--clock`` is not given: ``"cpu"``
    when every one is the host's CPU, else ``"wall"`` (see the module docstring)."""
    if not devices:
        raise ValueError("default_clock needs the device of at least one run")
    return "cpu" if all(runs_on_host_cpu(d) for d in devices) else "wall"


def add_threads(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--threads", type=int, default=1, help=help)


def use_threads(threads: int) -> None:
    """``--threads``: 0 leaves torch's default."""
    if threads:
        torch.set_num_threads(threads)


# --backend: what a run trains on (environment.setup_backend); --compile-backend: the compiler
# of the compiled ones. Listed here, not imported, so that reading the options needs no torch-xla.
BACKEND_CHOICES = ("eager", "compiled", "cuda", "cuda-compiled", "xla")


def add_backend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default="eager",
        help="eager CPU (default); compiled: the CPU with each arm's model under torch.compile; "
        "cuda / cuda-compiled: one GPU, likewise; xla: torch-xla (PJRT_DEVICE, CPU unless set; NEURON on Trainium)",
    )
    p.add_argument(
        "--compile-backend",
        help="torch.compile's compiler on the compiled backends (default inductor; 'eager' traces the graphs "
        "without generating code)",
    )


def check_backend(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.compile_backend is not None and args.backend not in ("compiled", "cuda-compiled"):
        p.error("--compile-backend needs --backend compiled or cuda-compiled")
