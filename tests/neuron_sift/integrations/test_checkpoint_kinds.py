"""The fixed-length stream's state names its kind like the loaders' states do, and a loader
refuses it naming it. The envelope itself and the two loaders' refusals of each other's
states are tested in tests/neuron_sift/shared/test_checkpoints.py."""

import pytest

from neuron_sift.integrations.schedules import ExactLengthLoader
from neuron_sift.shared.checkpoints import state_kind
from tests.neuron_sift.shared.test_checkpoints import epoch_level, per_batch


def test_the_exact_length_state_names_its_kind():
    assert state_kind(ExactLengthLoader(per_batch()).state_dict()) == "ExactLengthLoader"


def test_an_exact_length_state_into_the_per_batch_loader():
    with pytest.raises(ValueError, match=r"not a SiftingDataloader state: it comes from ExactLengthLoader"):
        per_batch().load_state_dict(ExactLengthLoader(per_batch()).state_dict())


def test_an_exact_length_state_into_the_epoch_loader():
    with pytest.raises(ValueError, match=r"not an EpochSiftingDataloader state: it comes from ExactLengthLoader"):
        epoch_level().load_state_dict(ExactLengthLoader(per_batch()).state_dict())
