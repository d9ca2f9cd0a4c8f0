"""The sifting configs: smart_sifting's names and defaults, dict forms, validation messages."""

import math
from fractions import Fraction

import numpy as np
import pytest

import neuron_sift
from neuron_sift.exceptions import SiftConfigValidationException
from neuron_sift.sift_config.sift_configs import (
    LossConfig,
    RelativeProbabilisticSiftConfig,
    SiftingBaseConfig,
    coerce_sift_config,
)

RPSC = RelativeProbabilisticSiftConfig


def _valid_dict(**overrides):
    d = {
        "beta_value": 3,
        "loss_history_length": 500,
        "loss_based_sift_config": {"sift_config": {"sift_delay": 10, "repeat_delay_per_epoch": True}},
    }
    d.update(overrides)
    return d


# -- names and defaults ---------------------------------------------------------------------


def test_names_live_at_the_smart_sifting_paths():
    assert neuron_sift.RelativeProbabilisticSiftConfig is RPSC
    assert neuron_sift.LossConfig is LossConfig
    assert neuron_sift.SiftingBaseConfig is SiftingBaseConfig
    assert issubclass(SiftConfigValidationException, ValueError)
    assert neuron_sift.SiftConfigValidationException is SiftConfigValidationException


def test_sifting_base_config_defaults():
    c = SiftingBaseConfig()
    assert c.sift_delay == 1000
    assert c.repeat_delay_per_epoch is False


def test_documented_example_builds():
    # The example of the smart_sifting documentation, verbatim.
    cfg = RPSC(
        beta_value=3,
        loss_history_length=500,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=10)),
    )
    assert cfg.beta_value == 3.0 and isinstance(cfg.beta_value, float)
    assert cfg.loss_history_length == 500
    assert cfg.loss_based_sift_config.sift_config.sift_delay == 10
    assert cfg.loss_based_sift_config.sift_config.repeat_delay_per_epoch is False
    assert cfg.base_config is cfg.loss_based_sift_config.sift_config


def test_positional_arguments_in_documented_order():
    cfg = RPSC(0.5, 100, LossConfig(SiftingBaseConfig(0, True)))
    assert (cfg.beta_value, cfg.loss_history_length) == (0.5, 100)
    assert cfg.base_config == SiftingBaseConfig(sift_delay=0, repeat_delay_per_epoch=True)


def test_neuron_sift_additions_default_to_smart_sifting_behaviour():
    cfg = RPSC(beta_value=1, loss_history_length=10)
    assert cfg.selection_mode == "probabilistic"
    assert cfg.seed is None
    # Omitted loss_based_sift_config: the default delay.
    assert cfg.base_config == SiftingBaseConfig()


def test_beta_and_history_are_required():
    with pytest.raises(TypeError):
        RPSC()
    with pytest.raises(SiftConfigValidationException, match="loss_history_length"):
        RPSC.from_dict({"beta_value": 1})
    with pytest.raises(SiftConfigValidationException, match="beta_value"):
        RPSC.from_dict({"loss_history_length": 10})


# -- dict forms -----------------------------------------------------------------------------


def test_nested_dicts_equal_objects():
    objects = RPSC(
        beta_value=3,
        loss_history_length=500,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=10, repeat_delay_per_epoch=True)),
    )
    from_dict = RPSC.from_dict(_valid_dict())
    assert from_dict == objects
    assert isinstance(from_dict.loss_based_sift_config, LossConfig)
    assert isinstance(from_dict.base_config, SiftingBaseConfig)
    # Any level may be a dict while the others are objects.
    assert RPSC(3, 500, {"sift_config": SiftingBaseConfig(10, True)}) == objects
    assert RPSC(3, 500, LossConfig(sift_config={"sift_delay": 10, "repeat_delay_per_epoch": True})) == objects
    assert RPSC(3, 500, {"sift_config": {"sift_delay": 10, "repeat_delay_per_epoch": True}}) == objects
    assert coerce_sift_config(_valid_dict()) == objects
    assert coerce_sift_config(objects) is objects


def test_loss_config_from_dict_and_partial_dicts_take_defaults():
    assert LossConfig(sift_config={"sift_delay": 5}).sift_config == SiftingBaseConfig(5, False)
    assert LossConfig(sift_config={}).sift_config == SiftingBaseConfig()
    assert LossConfig.from_dict({}) == LossConfig()
    assert LossConfig.from_dict({"sift_config": {"sift_delay": 0}}).sift_config.sift_delay == 0
    assert SiftingBaseConfig.from_dict({"repeat_delay_per_epoch": True}) == SiftingBaseConfig(1000, True)
    cfg = RPSC(beta_value=1, loss_history_length=10, loss_based_sift_config={})
    assert cfg.base_config == SiftingBaseConfig()


def test_user_dict_is_not_modified():
    d = _valid_dict()
    nested = d["loss_based_sift_config"]
    snapshot = {"loss_based_sift_config": {"sift_config": dict(nested["sift_config"])}}
    RPSC.from_dict(d)
    assert isinstance(d["loss_based_sift_config"], dict)
    assert d["loss_based_sift_config"] == snapshot["loss_based_sift_config"]


def test_numpy_scalars_are_accepted():
    cfg = RPSC(np.float32(0.5), np.int64(64))
    assert cfg.beta_value == 0.5 and type(cfg.beta_value) is float
    assert cfg.loss_history_length == 64 and type(cfg.loss_history_length) is int


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
def test_selection_modes(mode):
    assert RPSC(1, 10, selection_mode=mode).selection_mode == mode
    assert RPSC.from_dict(_valid_dict(selection_mode=mode)).selection_mode == mode


@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1, 2**40])
def test_valid_seeds(seed):
    assert RPSC(1, 10, seed=seed).seed == seed


# -- validation -----------------------------------------------------------------------------


def _raises(fn, *words):
    with pytest.raises(SiftConfigValidationException) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)
    return msg


@pytest.mark.parametrize("beta", [0, 0.0, -1, -0.5, float("nan"), float("inf"), float("-inf")])
def test_beta_out_of_range(beta):
    _raises(lambda: RPSC(beta_value=beta, loss_history_length=10), "beta_value", repr(beta))
    _raises(lambda: RPSC.from_dict(_valid_dict(beta_value=beta)), "beta_value")


@pytest.mark.parametrize("beta", [True, False, "3", None, [1.0], 1 + 2j])
def test_beta_wrong_type(beta):
    _raises(lambda: RPSC(beta_value=beta, loss_history_length=10), "beta_value", type(beta).__name__)


@pytest.mark.parametrize("length", [0, -1, -500])
def test_history_length_below_one(length):
    _raises(lambda: RPSC(beta_value=1, loss_history_length=length), "loss_history_length", str(length))


@pytest.mark.parametrize("length", [5.0, 5.5, True, "5", None])
def test_history_length_not_an_int(length):
    _raises(lambda: RPSC(beta_value=1, loss_history_length=length), "loss_history_length", type(length).__name__)


@pytest.mark.parametrize("delay", [-1, -1000])
def test_sift_delay_negative(delay):
    _raises(lambda: SiftingBaseConfig(sift_delay=delay), "sift_delay", str(delay))
    _raises(lambda: RPSC(1, 10, {"sift_config": {"sift_delay": delay}}), "sift_delay")


@pytest.mark.parametrize("delay", [10.0, "10", True, None])
def test_sift_delay_not_an_int(delay):
    _raises(lambda: SiftingBaseConfig(sift_delay=delay), "sift_delay", type(delay).__name__)
    _raises(lambda: LossConfig(sift_config={"sift_delay": delay}), "sift_delay")


@pytest.mark.parametrize("flag", [0, 1, "True", None, 1.0])
def test_repeat_delay_per_epoch_not_a_bool(flag):
    _raises(lambda: SiftingBaseConfig(repeat_delay_per_epoch=flag), "repeat_delay_per_epoch", type(flag).__name__)
    _raises(
        lambda: RPSC.from_dict(_valid_dict(loss_based_sift_config={"sift_config": {"repeat_delay_per_epoch": flag}})),
        "repeat_delay_per_epoch",
    )


@pytest.mark.parametrize("mode", ["Fixed", "random", "", None, 1])
def test_selection_mode_invalid(mode):
    _raises(lambda: RPSC(1, 10, selection_mode=mode), "selection_mode", repr(mode))


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_seed_invalid(seed):
    _raises(lambda: RPSC(1, 10, seed=seed), "seed")


def test_unknown_top_level_key_is_named():
    msg = _raises(lambda: RPSC.from_dict(_valid_dict(beta=2)), "'beta'")
    assert "beta_value" in msg  # the expected keys are listed, so a typo is easy to spot


def test_unknown_nested_keys_are_named():
    _raises(lambda: RPSC.from_dict(_valid_dict(loss_based_sift_config={"sift_cfg": {}})), "'sift_cfg'", "LossConfig")
    _raises(
        lambda: RPSC.from_dict(_valid_dict(loss_based_sift_config={"sift_config": {"sift_dealy": 3}})),
        "'sift_dealy'",
        "SiftingBaseConfig",
    )
    _raises(lambda: LossConfig(sift_config={"delay": 3}), "'delay'")


def test_unknown_keys_of_mixed_types_are_named():
    msg = _raises(lambda: RPSC.from_dict(_valid_dict(**{"x": 1}) | {1: 2}), "'x'")
    assert "1" in msg


@pytest.mark.parametrize("value", [None, 5, "beta_value=1", [("beta_value", 1), ("loss_history_length", 5)]])
def test_from_dict_of_a_non_mapping(value):
    _raises(lambda: RPSC.from_dict(value), "RelativeProbabilisticSiftConfig", type(value).__name__)
    _raises(lambda: LossConfig.from_dict(value), "LossConfig")
    _raises(lambda: SiftingBaseConfig.from_dict(value), "SiftingBaseConfig")


@pytest.mark.parametrize("value", [None, 3, "x", SiftingBaseConfig(), [{"sift_config": {}}]])
def test_wrong_type_for_loss_based_sift_config(value):
    _raises(lambda: RPSC(1, 10, loss_based_sift_config=value), "loss_based_sift_config", type(value).__name__)


@pytest.mark.parametrize("value", [None, 3, "x", LossConfig(), [1]])
def test_wrong_type_for_sift_config(value):
    _raises(lambda: LossConfig(sift_config=value), "sift_config", type(value).__name__)
    _raises(lambda: RPSC.from_dict(_valid_dict(loss_based_sift_config={"sift_config": value})), "sift_config")


def test_coerce_rejects_other_types():
    _raises(lambda: coerce_sift_config(None), "sift_config", "NoneType")
    _raises(lambda: coerce_sift_config(LossConfig()), "sift_config", "LossConfig")


# -- expected_kept_share --------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.1, 0.5, 1, 3, 9])
def test_expected_kept_share_is_the_rules_mean_over_uniform_percentiles(beta):
    """The rule keeps a sample with probability ``percentile ** beta``; over percentiles
    spread evenly on (0, 1) that averages ``1 / (1 + beta)``."""
    percentiles = (np.arange(200_000) + 0.5) / 200_000
    share = RPSC(beta, 10).expected_kept_share()
    assert share == pytest.approx(float(np.mean(percentiles**beta)), rel=1e-6)
    assert share == 1.0 / (1.0 + beta)


@pytest.mark.parametrize("beta", [0.1, 0.6, 1, 1.08, 3, 100])
def test_fixed_mode_keeps_the_expected_share_of_every_batch_rounded(beta):
    cfg = RPSC(beta, 10)
    for b in range(1, 513):
        assert abs(cfg.fixed_keep_count(b) - b * cfg.expected_kept_share()) <= 0.5 + 1e-9, b


# -- fixed_keep_count -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "b,beta,k",
    [
        (5, 1, 3),  # 2.5 rounds up
        (256, 3, 64),
        (3, 1, 2),  # 1.5 rounds up
        (1, 1, 1),  # 0.5 rounds up
        (1, 1.5, 0),  # 0.4
        (7, 0.5, 5),  # 4.67
        (10, 3, 3),  # 2.5 rounds up (banker's rounding would give 2)
        (6, 1.4, 3),  # 2.5 exactly in decimal
        (100, 100, 1),  # 0.99
        (64, 0.1, 58),  # 58.18
        (2, 3, 1),  # 0.5 rounds up
    ],
)
def test_fixed_keep_count_rounds_half_up(b, beta, k):
    assert RPSC(beta, 10).fixed_keep_count(b) == k


@pytest.mark.parametrize(
    "beta", ["0.1", "0.2", "0.25", "0.5", "0.6", "1", "1.4", "1.5", "2", "3", "4", "9", "10", "100"]
)
def test_fixed_keep_count_against_exact_arithmetic(beta):
    cfg = RPSC(float(beta), 10)
    exact_beta = Fraction(beta)  # the decimal the user wrote
    for b in range(1, 513):
        want = math.floor(Fraction(b) / (1 + exact_beta) + Fraction(1, 2))
        assert cfg.fixed_keep_count(b) == want, b


@pytest.mark.parametrize(
    "config,where",
    [
        (
            {"beta_value": 1, "loss_history_length": 8, "sift_delay": 3, "loss_based_sift_config": {"sift_config": {}}},
            "loss_based_sift_config.sift_config.sift_delay",
        ),
        (
            {
                "beta_value": 1,
                "loss_history_length": 8,
                "loss_based_sift_config": {"repeat_delay_per_epoch": True, "sift_config": {}},
            },
            "sift_config.repeat_delay_per_epoch",
        ),
    ],
)
def test_a_nested_key_given_too_high_says_where_it_belongs(config, where):
    from neuron_sift.sift_config.sift_configs import coerce_sift_config

    with pytest.raises(SiftConfigValidationException, match="belongs in " + where.replace(".", r"\.")):
        coerce_sift_config(config)
