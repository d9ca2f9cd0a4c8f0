"""The two snapshots of the metrics surface, one per mode: ``SiftingMetrics`` (a
``SiftingDataloader``) and ``EpochSiftingMetrics`` (an ``EpochSiftingDataloader``).

Why two classes behind one surface: the modes count different things (samples seen and
kept per batch; plans, weights and recorded losses per epoch), but every reader needs the
same three views of them: an object, flat scalars for a logger (``.scalars(prefix)``) and
a plain dict (``.as_dict()``). ``default_prefix`` and ``step`` let the log, TensorBoard and
Lightning paths treat either alike.

The measured share of samples kept is ``observed_kept_share`` in both modes (apart from the
epoch config's ``kept_share`` setting).
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from neuron_sift.dataloader.sift_dataloader import SiftingDataloader
    from neuron_sift.epoch.loader import EpochSiftingDataloader

DEFAULT_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def quantile_key(q: float) -> str:
    return f"loss_history_q{q * 100:g}"


@dataclass
class SiftingMetrics:
    """A snapshot of one ``SiftingDataloader``.

    ``counts``: every count of ``SiftingCounts`` by name, each also an attribute
    (``m.num_orig_samples_seen``). ``observed_kept_share``: kept / seen.
    ``machinery_seconds``: host seconds in sifting itself (transform, should_sift, sift,
    accumulate, reverse_transform), without the user's scoring forward, which is
    ``scoring_seconds``. ``machinery_latency``: ``machinery_seconds`` per sifted
    (non-delayed) source batch. ``batch_creation_latency``: machinery plus scoring seconds
    per emitted sifted batch (the mean of the logged ``sifted_batch_creation_latency``). On
    XLA these are host (tracing) times; the device runs asynchronously. ``compile_count``:
    compilations in this process so far (XLA backend only, else None).
    """

    counts: dict[str, int]
    observed_kept_share: float
    history_fill: int
    history_length: int
    history_quantiles: dict[float, float]
    machinery_seconds: float
    scoring_seconds: float
    machinery_latency: float
    batch_creation_latency: float
    compile_count: int | None
    backend: str
    selection_mode: str
    epoch: int | None  # the current (or last) epoch's 0-based index, as the epoch loader's; None before the first
    timings: dict[str, dict[str, float]] = field(default_factory=dict)

    default_prefix = "sifting/"

    def __getattr__(self, name: str) -> Any:
        counts = self.__dict__.get("counts")
        if counts is not None and name in counts:
            return counts[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def step(self) -> int:
        """The default global step of a TensorBoard write: batches emitted."""
        return int(self.counts["num_batches_emitted"])

    def as_dict(self) -> dict:
        """Every field, with the counts also flat at the top level (as in 0.4.0)."""
        return {**self.counts, **asdict(self)}

    def scalars(self, prefix: str = "") -> dict[str, float]:
        """Flat ``name -> number`` for loggers (Lightning, the HF Trainer, TensorBoard).

        Names: the counts a dashboard follows, ``observed_kept_share``, ``history_fill``,
        ``loss_history_q<percent>`` (e.g. ``loss_history_q50``), ``machinery_seconds``,
        ``scoring_seconds``, ``machinery_latency``, ``batch_creation_latency``, and
        ``compile_count`` on XLA; each prefixed with ``prefix``.
        """
        c = self.counts
        out: dict[str, float] = {
            name: c[name]
            for name in (
                "num_orig_samples_seen",
                "num_orig_samples_kept",
                "num_orig_samples_sifted",
                "num_samples_pending",
                "num_batches_emitted",
                "num_nonfinite_losses",
            )
        }
        # Kept samples a data-parallel rank dropped at its max_pending bound (0 otherwise).
        out["num_samples_dropped"] = c.get("num_samples_dropped", 0)
        out["observed_kept_share"] = self.observed_kept_share
        out["history_fill"] = self.history_fill
        for q, v in self.history_quantiles.items():
            out[quantile_key(q)] = v
        out["machinery_seconds"] = self.machinery_seconds
        out["scoring_seconds"] = self.scoring_seconds
        out["machinery_latency"] = self.machinery_latency
        out["batch_creation_latency"] = self.batch_creation_latency
        if self.compile_count is not None:
            out["compile_count"] = self.compile_count
        return {prefix + k: v for k, v in out.items()}


def history_quantiles(loader: "SiftingDataloader", quantiles: Sequence[float] = DEFAULT_QUANTILES, fill=None):
    """Quantiles of the valid part of the loss history (the first ``fill`` entries); {} if empty."""
    qs = [float(q) for q in quantiles]
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantiles must lie in [0, 1], got {q}")
    state = loader.sifter.state
    if fill is None:
        fill = int(loader.backend.to_host(state.fill))
    if fill <= 0 or not qs:
        return {}
    valid = loader.backend.to_host(state.history)[:fill].float()
    values = torch.quantile(valid, torch.tensor(qs, dtype=torch.float32))
    return {q: float(v) for q, v in zip(qs, values.tolist())}


def sifting_snapshot(sl: "SiftingDataloader", quantiles: Sequence[float] = DEFAULT_QUANTILES) -> SiftingMetrics:
    """Snapshot ``sl``: its counts object (with the non-finite count of the same host read as
    the history fill), the loss history's quantiles and the phase timings."""
    raw = sl.metrics()  # one host read of the device counters
    counts = sl.counts.as_dict(raw["num_nonfinite_losses"])
    fill = int(raw["history_fill"])
    timings = {k: dict(v) for k, v in raw.get("timings", {}).items()}
    scoring = float(timings.get("calculate_relevance_values", {}).get("seconds", 0.0))
    machinery = float(raw["machinery_seconds"])
    sifted_sources = counts["num_source_batches"] - counts["num_source_batches_delayed"]
    sifted_batches = counts["num_batches_emitted"] - counts["num_source_batches_delayed"]
    return SiftingMetrics(
        counts=counts,
        observed_kept_share=sl.counts.observed_kept_share,
        history_fill=fill,
        history_length=sl.sift_config.loss_history_length,
        history_quantiles=history_quantiles(sl, quantiles, fill),
        machinery_seconds=machinery,
        scoring_seconds=scoring,
        machinery_latency=machinery / sifted_sources if sifted_sources > 0 else 0.0,
        batch_creation_latency=(machinery + scoring) / sifted_batches if sifted_batches > 0 else 0.0,
        compile_count=sl.backend.compile_count(),
        backend=str(getattr(sl.backend, "name", "")),
        selection_mode=sl.selection_mode,
        epoch=sl.position.index if sl.epoch else None,
        timings=timings,
    )


# The epoch snapshot's scalars, in order.
EPOCH_SCALARS = (
    "epoch",
    "epoch_finished",
    "observed_kept_share",
    "mean_weight",
    "max_weight",
    "scores_recorded",
    "num_nonfinite_losses",
    "excluded_by_guard",
    "unpaired_batches",
    "batches_recorded",
    "batches_skipped",
    "planning_seconds",
    "machinery_seconds",
    "planned_steps",
)


@dataclass
class EpochSiftingMetrics:
    """A snapshot of one ``EpochSiftingDataloader``: ``values`` is its ``metrics()`` (less the
    per-epoch ``epochs`` list, kept apart) plus ``planned_steps`` (the batches this rank
    still trains, the planner's count; None without ``num_epochs``).

    Scalars: ``observed_kept_share`` and ``mean_weight`` of the current epoch's plan (of
    the samples trained: with ``drop_last`` the cut short batches are not counted),
    ``max_weight``, ``scores_recorded``, ``num_nonfinite_losses``, ``excluded_by_guard``,
    ``epoch`` (the current epoch's 0-based index; absent before the first epoch),
    ``epoch_finished`` (1 once every batch of it on this rank has its losses),
    ``unpaired_batches``, ``batches_recorded``, ``batches_skipped``, ``planning_seconds``,
    ``machinery_seconds`` and ``planned_steps`` (absent without ``num_epochs``).
    """

    values: dict[str, Any]
    epochs: list[dict[str, Any]] = field(default_factory=list)

    default_prefix = "epoch_sifting/"

    @property
    def observed_kept_share(self) -> float:
        return float(self.values["observed_kept_share"])

    @property
    def step(self) -> int:
        """The default global step of a TensorBoard write: batches whose losses were recorded."""
        return int(self.values.get("batches_recorded", 0))

    def as_dict(self) -> dict:
        return {**self.values, "epochs": [dict(e) for e in self.epochs]}

    def scalars(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": float(self.values[k]) for k in EPOCH_SCALARS if self.values.get(k) is not None}


def epoch_snapshot(loader: "EpochSiftingDataloader") -> EpochSiftingMetrics:
    """Snapshot ``loader`` with ``loader.metrics()`` (one host read of the score table)."""
    values = loader.metrics()
    epochs = values.pop("epochs")
    values["planned_steps"] = loader.planned_steps() if loader.num_epochs is not None else None
    return EpochSiftingMetrics(values, epochs)
