"""Logger names and seed masking (``neuron_sift.shared.logs``)."""

import numpy as np
import pytest
import torch

from neuron_sift.shared.logs import EPOCH_LOGGER, LOADER_LOGGER, MASK63, seed63


def test_the_logger_names_users_filter_on():
    assert LOADER_LOGGER == "neuron_sift.dataloader.sift_dataloader"  # smart_sifting's documented name
    assert EPOCH_LOGGER == "neuron_sift.epoch.loader"


@pytest.mark.parametrize(
    "value,seed",
    [
        (0, 0),
        (5, 5),
        (2**63 - 1, 2**63 - 1),
        (2**63, 0),
        (2**63 + 5, 5),
        (2**64 - 1, 2**63 - 1),
        (2**80 + 7, 7),
        (-1, 2**63 - 1),
        (-(2**63), 0),
        (-5, 2**63 - 5),
    ],
)
def test_any_int_becomes_a_non_negative_int64_seed(value, seed):
    got = seed63(value)
    assert got == seed and type(got) is int
    assert torch.tensor(got, dtype=torch.int64).item() == got  # fits a seed tensor
    torch.Generator().manual_seed(got)


def test_numpy_and_bool_ints_and_the_mask():
    assert seed63(np.int64(-1)) == MASK63 == 2**63 - 1
    assert seed63(np.uint64(2**64 - 1)) == MASK63
    assert seed63(True) == 1
