"""The engine object: owns the device state and turns per-sample losses into selections."""

from collections.abc import Callable
from typing import Any

import torch

import neuron_sift.engine.step as step_module
from neuron_sift.backends.base import Backend
from neuron_sift.engine.cpu_step import HostSiftState, HostStepOutput, host_kernels_available, sift_step_cpu
from neuron_sift.engine.state import MAX_SEED, SiftState
from neuron_sift.engine.step import StepConstants, StepOutput, flat_inputs, flat_step, from_flat, sift_step
from neuron_sift.exceptions import SiftConfigValidationException
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.sift_config.sift_configs import RelativeProbabilisticSiftConfig


class Sifter:
    """Runs the per-source-batch step and keeps the sifting state.

    With a CPU model the state and the step live on the host (``cpu_step.py``); on any
    other device the torch step (``step.py``) runs there and ``step`` issues device work
    only: reading its result back (``read_selection``) is a separate, explicit call so the
    loader decides whether a host read happens at all.
    """

    def __init__(
        self,
        config: RelativeProbabilisticSiftConfig,
        backend: Backend,
        ranks: RankGroup | None = None,
        host_step: bool | None = None,
    ):
        self.config = config
        self.backend = backend
        self.mode = config.selection_mode
        self.ranks = ranks
        seed = config.seed if config.seed is not None else torch.initial_seed()
        if ranks is not None and ranks.active:
            # Ranks usually share one seed; their draws must still be independent.
            seed = int(seed) * 1_000_003 + 7919 * (ranks.rank + 1)
        # The backend says whether the step should run on the host (a CPU model), the C
        # kernels whether it can; the torch step runs everywhere else. ``host_step``
        # overrides it (benchmarks/machinery.py and the tests compare the two); True needs
        # a device and a build that can run it.
        can_host = backend.can_run_step_on_host and host_kernels_available()
        if host_step and not can_host:
            raise ValueError(f"host_step=True needs a CPU device and the C kernels, not {backend.device}")
        self._on_host = (can_host and backend.runs_step_on_host) if host_step is None else bool(host_step)
        self._device_state: SiftState | None = None
        self._host_state: HostSiftState | None = None
        self._consts: dict[int, StepConstants] = {}  # per padded batch size (device step)
        self._step_fns: dict[tuple, Callable] = {}  # flat_step per key (see step())
        self._seed = int(seed) % MAX_SEED
        # Made on the CPU; the setter places it (reading the seed there needs no device read).
        self.state = SiftState.create(config.loss_history_length, self._seed, torch.device("cpu"))
        self.global_history = bool(config.global_loss_history and ranks is not None and ranks.active)
        self._beta = backend.upload([config.beta_value], torch.float32)[0]
        # (valid rows, rows to take) -> device vector: uploaded once per distinct pair (in
        # practice two: full batches and the short last one), not once per source batch.
        self._per_batch: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def state(self) -> SiftState:
        """The sifting state as tensors on the backend's device (a copy when held on the host)."""
        # The setter, run by __init__, installed the state on the side ``_on_host`` names.
        if self._on_host:
            assert self._host_state is not None
            return self._host_state.to_state()
        assert self._device_state is not None
        return self._device_state

    @state.setter
    def state(self, value: SiftState) -> None:
        """Install ``value`` (pass CPU tensors: the seed is read on the host)."""
        self._seed = int(value.seed)
        if self._on_host:
            self._host_state = HostSiftState.from_state(value)
        else:
            self._device_state = value.to(self.backend.device)
            self._consts = {}  # they depend on the seed

    # -- checkpoints: the state as CPU tensors by name (SiftState.tensors) -----------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.state.tensors().items()}

    def check_state(self, state: Any) -> None:
        """Refuse a state this sifter cannot restore (``SiftState.check``); changes nothing."""
        SiftState.check(state, self.config.loss_history_length)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.check_state(state)
        self.state = SiftState(**{k: v.cpu() for k, v in state.items()})  # the setter places it

    def fixed_keep_count(self, batch_size: int) -> int:
        """k for a full batch; an error when it is 0 (fixed or topk mode would never emit)."""
        k = self.config.fixed_keep_count(batch_size)
        if k < 1:
            raise SiftConfigValidationException(
                f"RelativeProbabilisticSiftConfig.beta_value: selection_mode={self.mode!r} keeps round(B / (1 + beta)) "
                f"= round({batch_size} / {1 + self.config.beta_value:g}) = 0 samples of each batch of "
                f"{batch_size}; use a larger batch size or a smaller beta_value"
            )
        return k

    def rows_taken(self, n_valid: int, rows: int) -> int:
        """Fixed and topk modes: samples kept from a batch of ``n_valid`` real rows (padded to ``rows``)."""
        return min(self.config.fixed_keep_count(n_valid), self.fixed_keep_count(rows))

    def step(self, losses: torch.Tensor, n_valid: int, batch_size: int) -> StepOutput | HostStepOutput:
        """Issue the selection math for one source batch; ``losses`` may be short or padded."""
        rows = max(batch_size, int(losses.shape[0]))
        if losses.shape[0] < rows:  # pad to the static size; padding rows are masked out
            losses = torch.cat([losses, losses.new_zeros(rows - losses.shape[0])])
        fixed = self.config.keeps_exact_count
        k = self.fixed_keep_count(rows) if fixed else 1
        n_take = self.rows_taken(n_valid, rows) if fixed else 0
        per_batch = None
        if not self._on_host or self.global_history:
            per_batch = self._per_batch.get((n_valid, n_take))
            if per_batch is None:
                per_batch = self._per_batch[(n_valid, n_take)] = self.backend.upload([n_valid, n_take], torch.int64)
        shared_losses = shared_valid = None
        if self.global_history:
            # global_history needs active ranks (__init__), and per_batch was uploaded just above
            assert self.ranks is not None and per_batch is not None
            # One all-gather of W x (P + 1) float32 per source batch: losses and valid count.
            mine = torch.cat([losses.to(torch.float32), per_batch[:1].to(torch.float32)])
            gathered = self.ranks.all_gather_rows(mine).view(self.ranks.world_size, rows + 1)
            shared_losses = gathered[:, :rows].reshape(-1)
            rows_idx = torch.arange(rows, device=losses.device).unsqueeze(0)
            shared_valid = (rows_idx < gathered[:, rows:].to(torch.int64)).reshape(-1)
        if self._on_host:
            assert self._host_state is not None  # installed by the state setter in __init__
            return sift_step_cpu(
                self._host_state, losses, n_valid, self._beta, self.mode, k, n_take, shared_losses, shared_valid
            )
        consts = self._consts.get(rows)
        if consts is None:
            consts = self._consts[rows] = StepConstants.create(
                rows, self.config.loss_history_length, k, self._seed, self.backend.device
            )
        # The backend runs the step: op by op, as one graph built once (torch-xla), or
        # compiled (torch.compile); the same function of the same tensors either way.
        # The key names all a traced step depends on besides its inputs, the functions too
        # (benchmarks and tests swap the percentile kernel or the step).
        method = self.backend.sort_method
        key = (self.mode, k, shared_losses is not None, sift_step, step_module.percentile_rank_auto, method)
        fn = self._step_fns.get(key)
        if fn is None:
            fn = self._step_fns[key] = flat_step(
                self.mode, k, shared_losses is not None, step_fn=sift_step, sort_method=method
            )
        assert self._device_state is not None and per_batch is not None  # __init__'s setter; uploaded above
        inputs = flat_inputs(
            self._device_state, losses.to(torch.float32), per_batch, self._beta, consts, shared_losses, shared_valid
        )
        self._device_state, out = from_flat(self.backend.run_step(key, fn, inputs))
        return out

    def read_selection(self, out: StepOutput | HostStepOutput) -> tuple[torch.Tensor, int]:
        """One host read: the kept row indices (source order, a CPU int64 tensor) and the non-finite count."""
        if isinstance(out, HostStepOutput):  # already on the host
            return torch.from_numpy(out.kept), out.num_nonfinite
        packed = self.backend.to_host(torch.cat([out.count.view(1), out.num_nonfinite.view(1), out.order]))
        count, nonfinite = int(packed[0]), int(packed[1])
        return packed[2 : 2 + count], nonfinite

    def read_counts(self, out: StepOutput) -> tuple[int, int]:
        """One host read of two scalars: kept count and non-finite count (device step only)."""
        packed = self.backend.to_host(torch.stack([out.count, out.num_nonfinite]))
        return int(packed[0]), int(packed[1])

    def num_nonfinite(self) -> int:
        """Non-finite losses seen so far: the engine's counter, the one source of that count."""
        if self._on_host:
            assert self._host_state is not None  # installed by the state setter in __init__
            return int(self._host_state.num_nonfinite)
        assert self._device_state is not None  # installed by the state setter in __init__
        return int(self.backend.to_host(self._device_state.num_nonfinite))

    def read_counters(self) -> tuple[int, int, int, int]:
        """History fill and the scored, kept and non-finite counters, in one host read."""
        st = self.state
        fill, scored, kept, nonfinite = self.backend.to_host(
            torch.stack([st.fill, st.num_scored, st.num_kept, st.num_nonfinite])
        ).tolist()
        return int(fill), int(scored), int(kept), int(nonfinite)
