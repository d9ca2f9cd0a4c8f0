"""Sifting configuration as validated dataclasses.

The three classes keep smart_sifting's names, fields and defaults; every nested config
may also be given as a dict. Validation happens at construction so that a bad value
fails before training starts, with ``SiftConfigValidationException`` naming the key.
"""

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from neuron_sift.exceptions import SiftConfigValidationException

SELECTION_MODES = ("probabilistic", "fixed")


def _fail(owner: str, key: str, message: str) -> None:
    raise SiftConfigValidationException(f"{owner}.{key}: {message}")


def _check_int(owner: str, key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(owner, key, f"expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        _fail(owner, key, f"must be >= {minimum}, got {value}")


def _check_bool(owner: str, key: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(owner, key, f"expected a bool, got {type(value).__name__} {value!r}")


# Keys of a nested config given one level too high (a common slip): where they belong.
_NESTED_KEYS = {
    "RelativeProbabilisticSiftConfig": {
        "sift_delay": "loss_based_sift_config.sift_config.sift_delay",
        "repeat_delay_per_epoch": "loss_based_sift_config.sift_config.repeat_delay_per_epoch",
        "sift_config": "loss_based_sift_config.sift_config",
    },
    "LossConfig": {
        "sift_delay": "sift_config.sift_delay",
        "repeat_delay_per_epoch": "sift_config.repeat_delay_per_epoch",
    },
}


def _from_mapping(cls, owner_key: str, value: Mapping[str, Any]):
    """Build ``cls`` from a dict, naming unknown and missing keys."""
    if not isinstance(value, Mapping):
        raise SiftConfigValidationException(
            f"{owner_key}: expected a dict of {cls.__name__} fields, got {type(value).__name__} {value!r}"
        )
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - names, key=repr)  # keys of mixed types cannot be compared
    if unknown:
        where = _NESTED_KEYS.get(cls.__name__, {})
        hints = [f"{k!r} belongs in {where[k]}" for k in unknown if k in where]
        raise SiftConfigValidationException(
            f"{owner_key}: unknown key(s) {unknown} for {cls.__name__}; expected keys {sorted(names)}"
            + (f" ({'; '.join(hints)})" if hints else "")
        )
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [k for k in required if k not in value]
    if missing:
        raise SiftConfigValidationException(f"{owner_key}: missing key(s) {missing} for {cls.__name__}")
    return cls(**value)


@dataclass
class SiftingBaseConfig:
    """When sifting starts.

    ``sift_delay``: number of source batches, counted from the start of training, that
    pass through unchanged before sifting starts (during the delay each source batch is
    one training step, so source batches and training steps coincide). No scoring forward
    pass runs during the delay.
    ``repeat_delay_per_epoch``: start the delay again at the beginning of every epoch.
    """

    sift_delay: int = 1000
    repeat_delay_per_epoch: bool = False

    def __post_init__(self) -> None:
        _check_int("SiftingBaseConfig", "sift_delay", self.sift_delay, 0)
        _check_bool("SiftingBaseConfig", "repeat_delay_per_epoch", self.repeat_delay_per_epoch)

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> "SiftingBaseConfig":
        return _from_mapping(cls, "SiftingBaseConfig", value)


@dataclass
class LossConfig:
    """Loss-based sifting settings; holds the ``SiftingBaseConfig`` (or an equivalent dict)."""

    sift_config: Union[SiftingBaseConfig, Mapping[str, Any]] = field(default_factory=SiftingBaseConfig)

    def __post_init__(self) -> None:
        if isinstance(self.sift_config, Mapping):
            self.sift_config = SiftingBaseConfig.from_dict(self.sift_config)
        elif not isinstance(self.sift_config, SiftingBaseConfig):
            _fail(
                "LossConfig",
                "sift_config",
                f"expected a SiftingBaseConfig or a dict, got {type(self.sift_config).__name__}",
            )

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> "LossConfig":
        return _from_mapping(cls, "LossConfig", value)


@dataclass
class RelativeProbabilisticSiftConfig:
    """The sifting rule: keep a sample with probability ``percentile ** beta_value``.

    ``beta_value`` (> 0): expected kept share is ``1 / (1 + beta_value)``.
    ``loss_history_length`` (int >= 1): how many of the most recent per-sample losses a
    new loss is ranked against.
    ``loss_based_sift_config``: a ``LossConfig`` or an equivalent dict.
    ``selection_mode`` (neuron_sift addition): ``"probabilistic"`` (default, smart_sifting
    semantics) or ``"fixed"`` (exactly ``round(B / (1 + beta))`` samples of each source
    batch of size B, no host reads, known length).
    ``seed`` (neuron_sift addition): seed of the selection draws; ``None`` takes
    ``torch.initial_seed()`` when the loader is built, so ``torch.manual_seed`` makes runs
    repeatable.
    ``global_loss_history`` (neuron_sift addition): under ``torch.distributed``, rank each
    loss against the recent losses of all ranks (one all-gather of the batch's losses per
    source batch), so selection does not depend on how data was partitioned.
    """

    beta_value: float
    loss_history_length: int
    loss_based_sift_config: Union[LossConfig, Mapping[str, Any]] = field(default_factory=LossConfig)
    selection_mode: str = "probabilistic"
    seed: Optional[int] = None
    global_loss_history: bool = False

    def __post_init__(self) -> None:
        owner = "RelativeProbabilisticSiftConfig"
        beta = self.beta_value
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
            _fail(owner, "beta_value", f"expected a number, got {type(beta).__name__} {beta!r}")
        if not math.isfinite(float(beta)) or beta <= 0:
            _fail(owner, "beta_value", f"must be a finite number > 0, got {beta!r}")
        self.beta_value = float(beta)
        _check_int(owner, "loss_history_length", self.loss_history_length, 1)
        self.loss_history_length = int(self.loss_history_length)
        if isinstance(self.loss_based_sift_config, Mapping):
            self.loss_based_sift_config = LossConfig.from_dict(self.loss_based_sift_config)
        elif not isinstance(self.loss_based_sift_config, LossConfig):
            _fail(
                owner,
                "loss_based_sift_config",
                f"expected a LossConfig or a dict, got {type(self.loss_based_sift_config).__name__}",
            )
        if not isinstance(self.selection_mode, str) or self.selection_mode not in SELECTION_MODES:
            _fail(owner, "selection_mode", f"expected one of {SELECTION_MODES}, got {self.selection_mode!r}")
        if self.seed is not None:
            _check_int(owner, "seed", self.seed, 0)
        _check_bool(owner, "global_loss_history", self.global_loss_history)

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> "RelativeProbabilisticSiftConfig":
        return _from_mapping(cls, owner_key=cls.__name__, value=value)

    @property
    def base_config(self) -> SiftingBaseConfig:
        return self.loss_based_sift_config.sift_config

    def fixed_keep_count(self, batch_size: int) -> int:
        """``round(B / (1 + beta))`` with halves rounded up (not Python's banker's rounding)."""
        return int(math.floor(batch_size / (1.0 + self.beta_value) + 0.5))


def coerce_sift_config(value: Any) -> RelativeProbabilisticSiftConfig:
    """Accept a config object or an equivalent dict."""
    if isinstance(value, RelativeProbabilisticSiftConfig):
        return value
    if isinstance(value, Mapping):
        return RelativeProbabilisticSiftConfig.from_dict(value)
    raise SiftConfigValidationException(
        f"sift_config: expected a RelativeProbabilisticSiftConfig or a dict, got {type(value).__name__}"
    )
