"""Sifting configuration as validated dataclasses.

The three classes keep smart_sifting's names, fields and defaults; every nested config
may also be given as a dict. Validation happens at construction so that a bad value
fails before training starts, with ``SiftConfigValidationException`` naming the key.
"""

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_sift.shared.validation import check_bool, check_int, coerce, fail, from_mapping

SELECTION_MODES = ("probabilistic", "fixed", "topk")
# What a sample is scored by: its loss, its excess over a reference loss, or the reference alone.
CRITERIA = ("loss", "excess", "reference")
# The scoring forward's precision: the model's own, or autocast to a lower one for scoring only.
SCORING_PRECISIONS = ("model", "bfloat16", "float16")


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
    return from_mapping(cls, owner_key, value, _NESTED_KEYS.get(cls.__name__, {}))


@dataclass
class SiftingBaseConfig:
    """When sifting starts.

    Losses of an untrained model rank noise, so sifting waits until the model has learned
    something. During the delay each source batch passes through unchanged and is one
    training step (source batches and training steps coincide), no scoring forward pass
    runs, and the loss history starts filling only when sifting starts.

    Args:
        sift_delay: source batches, counted from the start of training, passed through
            unchanged before sifting starts (int >= 0).
        repeat_delay_per_epoch: start the delay again at the beginning of every epoch.

    Raises:
        SiftConfigValidationException: a field has the wrong type or is negative.
    """

    sift_delay: int = 1000
    repeat_delay_per_epoch: bool = False

    def __post_init__(self) -> None:
        check_int("SiftingBaseConfig", "sift_delay", self.sift_delay, 0)
        check_bool("SiftingBaseConfig", "repeat_delay_per_epoch", self.repeat_delay_per_epoch)

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> "SiftingBaseConfig":
        return _from_mapping(cls, "SiftingBaseConfig", value)


@dataclass
class LossConfig:
    """Loss-based sifting settings: smart_sifting's wrapper around the ``SiftingBaseConfig``.

    Kept for smart_sifting's constructor chain
    (``RelativeProbabilisticSiftConfig(loss_based_sift_config=LossConfig(sift_config=...))``).

    Args:
        sift_config: a ``SiftingBaseConfig`` or an equivalent dict.

    Raises:
        SiftConfigValidationException: ``sift_config`` is neither, or a key of the dict is
            unknown, missing or invalid.
    """

    sift_config: SiftingBaseConfig | Mapping[str, Any] = field(default_factory=SiftingBaseConfig)

    def __post_init__(self) -> None:
        if isinstance(self.sift_config, Mapping):
            self.sift_config = SiftingBaseConfig.from_dict(self.sift_config)
        elif not isinstance(self.sift_config, SiftingBaseConfig):
            fail(
                "LossConfig",
                "sift_config",
                f"expected a SiftingBaseConfig or a dict, got {type(self.sift_config).__name__}",
            )

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> "LossConfig":
        return _from_mapping(cls, "LossConfig", value)


@dataclass
class RelativeProbabilisticSiftConfig:
    """The per-batch sifting rule: keep a sample with probability ``percentile ** beta_value``.

    A loss is ranked against recent losses rather than compared with a threshold, so the
    rule needs no tuning to the loss's scale and follows it as training lowers it. Validated
    at construction; every config may also be given as a (nested) dict.

    Args:
        beta_value: a number above 0; the expected kept share is ``1 / (1 + beta_value)`` while losses
            are stationary (less while the model learns fast).
        loss_history_length: int >= 1; how many of the most recent per-sample losses a
            new loss is ranked against. Shorter follows a falling loss more closely.
        loss_based_sift_config: a ``LossConfig`` or an equivalent dict (holds
            ``sift_delay``).
        selection_mode: neuron_sift addition. ``"probabilistic"`` (default, smart_sifting's
            semantics: each sample kept independently), ``"fixed"`` (exactly
            ``round(B / (1 + beta))`` samples of each source batch of size B, drawn with
            probabilities ``percentile ** beta``: no host reads on XLA, an exact ``len()``,
            equal steps on every rank without communication) or ``"topk"`` (the same count,
            the highest scores of the batch, no draw: the hard choice of RHO-LOSS).
        criterion: neuron_sift addition. What a sample is scored by: ``"loss"`` (default,
            the scoring forward's loss), ``"excess"`` (that loss minus the sample's loss
            under a reference model, read from the loader's ``reference`` table: high for
            what is learnable and not yet learned) or ``"reference"`` (minus the reference
            loss alone, no scoring forward: the static filter that keeps what the reference
            model predicts best). The last two need the loader's ``reference``.
        seed: neuron_sift addition. Seed of the selection draws (int >= 0); None takes
            ``torch.initial_seed()`` when the loader is built, so ``torch.manual_seed``
            makes runs repeatable.
        global_loss_history: neuron_sift addition. Under ``torch.distributed``, rank each
            loss against the recent losses of all ranks (one all-gather per source batch),
            so selection does not depend on how the data was partitioned.
        scoring_inference_mode: neuron_sift addition. Run the scoring forward under
            ``torch.inference_mode`` instead of ``torch.no_grad`` (no version counters, no
            view tracking). Opt-in: a model that caches a tensor made in its forward (a
            rotary table built on first use, say) and uses it in training then fails with
            "Inference tensors cannot be saved for backward".
        scoring_precision: neuron_sift addition. ``"model"`` (default) scores in the model's
            own precision; ``"bfloat16"`` or ``"float16"`` run the scoring forward under
            ``torch.autocast`` to that type on the model's device (the backend's; where the
            device's autocast does not take it the loader refuses at its first batch). Only
            the ranking sees the lower precision: the kept samples and the training step
            are the model's, and the losses are ranked as float32.

    Raises:
        SiftConfigValidationException: a field is missing, unknown (in a dict), of the
            wrong type or out of range; the message names the key.
    """

    beta_value: float
    loss_history_length: int
    loss_based_sift_config: LossConfig | Mapping[str, Any] = field(default_factory=LossConfig)
    selection_mode: str = "probabilistic"
    seed: int | None = None
    global_loss_history: bool = False
    scoring_inference_mode: bool = False
    scoring_precision: str = "model"
    criterion: str = "loss"

    def __post_init__(self) -> None:
        owner = "RelativeProbabilisticSiftConfig"
        beta = self.beta_value
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
            fail(owner, "beta_value", f"expected a number, got {type(beta).__name__} {beta!r}")
        if not math.isfinite(float(beta)) or beta <= 0:
            fail(owner, "beta_value", f"must be a finite number > 0, got {beta!r}")
        self.beta_value = float(beta)
        check_int(owner, "loss_history_length", self.loss_history_length, 1)
        self.loss_history_length = int(self.loss_history_length)
        if isinstance(self.loss_based_sift_config, Mapping):
            self.loss_based_sift_config = LossConfig.from_dict(self.loss_based_sift_config)
        elif not isinstance(self.loss_based_sift_config, LossConfig):
            fail(
                owner,
                "loss_based_sift_config",
                f"expected a LossConfig or a dict, got {type(self.loss_based_sift_config).__name__}",
            )
        if not isinstance(self.selection_mode, str) or self.selection_mode not in SELECTION_MODES:
            fail(owner, "selection_mode", f"expected one of {SELECTION_MODES}, got {self.selection_mode!r}")
        if self.seed is not None:
            check_int(owner, "seed", self.seed, 0)
        check_bool(owner, "global_loss_history", self.global_loss_history)
        check_bool(owner, "scoring_inference_mode", self.scoring_inference_mode)
        if not isinstance(self.scoring_precision, str) or self.scoring_precision not in SCORING_PRECISIONS:
            fail(owner, "scoring_precision", f"expected one of {SCORING_PRECISIONS}, got {self.scoring_precision!r}")
        if not isinstance(self.criterion, str) or self.criterion not in CRITERIA:
            fail(owner, "criterion", f"expected one of {CRITERIA}, got {self.criterion!r}")

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> "RelativeProbabilisticSiftConfig":
        return _from_mapping(cls, owner_key=cls.__name__, value=value)

    @property
    def base_config(self) -> SiftingBaseConfig:
        # __post_init__ turned dicts into a LossConfig holding a SiftingBaseConfig
        loss_config = self.loss_based_sift_config
        assert isinstance(loss_config, LossConfig)
        assert isinstance(loss_config.sift_config, SiftingBaseConfig)
        return loss_config.sift_config

    @property
    def keeps_exact_count(self) -> bool:
        """Whether every source batch keeps a known count (``fixed`` and ``topk``): an exact
        ``len()``, no host read of the count, equal steps on every rank."""
        return self.selection_mode != "probabilistic"

    @property
    def uses_reference(self) -> bool:
        """Whether the loader needs a reference table (``criterion`` ``excess`` or ``reference``)."""
        return self.criterion != "loss"

    def expected_kept_share(self) -> float:
        """The share of scored samples the rule keeps on average: ``1 / (1 + beta_value)``.

        Each sample is kept with probability ``percentile ** beta``; with its loss's
        percentile uniform over the history (losses stationary within the history window),
        that averages ``1 / (1 + beta)``. While the loss falls fast, new losses rank low and
        fewer are kept. The planned lengths (``len(loader)``, ``plan_epochs``) and their
        spread (``planned_steps_std``) count with it; fixed mode keeps this share of every
        source batch, rounded (``fixed_keep_count``).

        Returns:
            A share in (0, 1).
        """
        return 1.0 / (1.0 + self.beta_value)

    def fixed_keep_count(self, batch_size: int) -> int:
        """Samples fixed and topk modes keep of a source batch: ``round(B / (1 + beta))``, halves rounded up.

        ``B * expected_kept_share()``, rounded; halves round up, not to even as Python's
        ``round`` does.

        Args:
            batch_size: B, the source batch's size.

        Returns:
            The number of samples kept (0 when ``B / (1 + beta) < 0.5``; the loader then
            raises ``SiftConfigValidationException`` at the first batch).
        """
        # Divided, as it always was, not multiplied by the share: at a half the product can
        # land just below it (B = 26, beta = 1.08: 12.5, kept 13 this way, 12 the other), and
        # the count must be the exact arithmetic's on the beta the user wrote, as before.
        return int(math.floor(batch_size / (1.0 + self.beta_value) + 0.5))


def coerce_sift_config(value: Any) -> RelativeProbabilisticSiftConfig:
    """Accept a config object or an equivalent dict."""
    return coerce(RelativeProbabilisticSiftConfig, value)
