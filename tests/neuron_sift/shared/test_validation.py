"""Validation helpers (``neuron_sift.shared.validation``): for configs, every refusal is a
``SiftConfigValidationException`` whose message starts with ``Owner.key``, whichever
mode's config the user got wrong; for plain count arguments, ``positive_int``'s
``ValueError`` names the argument and the value."""

from dataclasses import dataclass

import numpy as np
import pytest

from neuron_sift.exceptions import SiftConfigValidationException
from neuron_sift.shared.validation import check_bool, check_int, check_real, coerce, fail, from_mapping, positive_int


def refused(prefix: str):
    return pytest.raises(SiftConfigValidationException, match=rf"^{prefix}")


def test_fail_names_owner_and_key():
    with refused(r"Cfg\.beta: too big$"):
        fail("Cfg", "beta", "too big")


@pytest.mark.parametrize(
    "value,message",
    [
        (True, r"expected an int, got bool True"),
        (2.0, r"expected an int, got float 2\.0"),
        ("3", r"expected an int, got str '3'"),
        (0, r"must be >= 1, got 0"),
    ],
)
def test_check_int_refusals(value, message):
    with refused(rf"Cfg\.size: {message}$"):
        check_int("Cfg", "size", value, 1)


def test_check_int_accepts_numpy_ints():
    check_int("Cfg", "size", np.int64(4), 1)
    check_int("Cfg", "size", 1, 1)


def test_check_bool():
    check_bool("Cfg", "flag", False)
    with refused(r"Cfg\.flag: expected a bool, got int 1$"):
        check_bool("Cfg", "flag", 1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "0.5", None])
def test_check_real_refuses_what_is_no_finite_number(value):
    with refused(r"Cfg\.share: expected a finite number, got "):
        check_real("Cfg", "share", value, 0.0, 1.0)


def test_check_real_bounds_open_and_closed():
    assert check_real("Cfg", "share", 1, 0.0, 1.0) == 1.0 and type(check_real("Cfg", "share", 1, 0.0, 1.0)) is float
    assert check_real("Cfg", "share", np.float32(0.5), 0.0, 1.0, low_open=True) == 0.5
    with refused(r"Cfg\.share: must be in \(0\.0, 1\.0\], got 0\.0$"):
        check_real("Cfg", "share", 0.0, 0.0, 1.0, low_open=True)
    with refused(r"Cfg\.share: must be in \[0\.0, 1\.0\), got 1$"):
        check_real("Cfg", "share", 1, 0.0, 1.0, high_open=True)
    with refused(r"Cfg\.share: must be in \[0\.0, 1\.0\], got -0\.5$"):
        check_real("Cfg", "share", -0.5, 0.0, 1.0)


@dataclass
class Inner:
    a: int
    b: int = 2

    @classmethod
    def from_dict(cls, value):
        return from_mapping(cls, "Outer.inner", value, hints={"seed": "Outer"})


def test_from_mapping_builds_the_dataclass():
    assert from_mapping(Inner, "Outer.inner", {"a": 1}) == Inner(1, 2)


def test_from_mapping_refusals_name_where():
    with refused(r"Outer\.inner: expected a dict of Inner fields, got list \[1\]$"):
        from_mapping(Inner, "Outer.inner", [1])
    with refused(r"Outer\.inner: unknown key\(s\) \['c'\] for Inner; expected keys \['a', 'b'\]$"):
        from_mapping(Inner, "Outer.inner", {"a": 1, "c": 3})
    with refused(r"Outer\.inner: unknown key\(s\) \['seed', 1\] for Inner; .* \('seed' belongs in Outer\)$"):
        Inner.from_dict({"a": 1, "seed": 0, 1: 2})  # keys of mixed types are still listed
    with refused(r"Outer\.inner: missing key\(s\) \['a'\] for Inner$"):
        from_mapping(Inner, "Outer.inner", {"b": 1})


def test_coerce_takes_an_instance_or_a_dict():
    inner = Inner(1)
    assert coerce(Inner, inner) is inner
    assert coerce(Inner, {"a": 5}) == Inner(5)
    with refused(r"sift_config: expected a Inner or a dict, got int$"):
        coerce(Inner, 3)
    with refused(r"epoch_config: expected a Inner or a dict, got str$"):
        coerce(Inner, "a", argument="epoch_config")


# -- positive_int ---------------------------------------------------------------------------


def test_positive_int_passes_a_count_through():
    assert positive_int(1, "epochs") == 1 and positive_int(7, "epochs") == 7
    assert positive_int(None, "lookahead", allow_none=True) is None


@pytest.mark.parametrize(
    "value, shown",
    [
        (0, "0"),
        (-3, "-3"),
        (True, "True"),
        (2.0, "2.0"),
        ("3", "'3'"),
        (None, "None"),
        (np.int64(2), r"np\.int64\(2\)|2"),
    ],
)
def test_positive_int_refuses_what_is_no_count_naming_argument_and_value(value, shown):
    with pytest.raises(ValueError, match=rf"^steps_per_epoch must be an int >= 1, got ({shown})$"):
        positive_int(value, "steps_per_epoch")


def test_positive_int_says_what_the_count_is_and_that_none_is_allowed():
    with pytest.raises(ValueError, match=r"^lookahead must be an int >= 1 \(batches held\) or None, got 0$"):
        positive_int(0, "lookahead", allow_none=True, what="batches held")
    with pytest.raises(ValueError, match=r"^epochs must be an int >= 1, got None$"):
        positive_int(None, "epochs")
