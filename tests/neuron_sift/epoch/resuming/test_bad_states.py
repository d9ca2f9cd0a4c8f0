"""Every state a user can hand ``EpochSiftingDataloader.load_state_dict``: a hand-edited one
(the table of ``state_edits.py``: wrong types, shapes, dtypes, out-of-range positions,
negative counts, NaN, infinite or negative weights, ids out of range or twice, lists where
tensors belong, missing keys, another rank or world size) and one changed on disk. Each is
refused with a ValueError that names the field and what is wrong, before any part of the
loader changes: the loader that refused it saves the same state and trains on as its twin
that never saw it. (Every rank's states of a run: ``test_resume.py``.)

A hand edit also changes the state's checksum, so an edited state with its checksum is
refused for that first; the table's tests drop the checksum (as in a state of a version
that wrote none) to reach each field's own check."""

import copy

import pytest
import torch

from neuron_sift.shared.checkpoints import CHECKSUM
from tests.neuron_sift.epoch.state_edits import (
    BAD,
    CHANGED,
    R,
    S,
    U,
    first_id,
    new_loader,
    saved,
    train_epochs,
    weights,
)


def edited(name, keep_checksum=False):
    table, edit, _match = BAD[name]
    state = copy.deepcopy(saved(table))
    edit(state)
    if not keep_checksum:
        del state[CHECKSUM]
    return state


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_state_is_refused_naming_the_field_and_the_loader_stays_as_it_was(name):
    table, _edit, match = BAD[name]
    state = edited(name)
    loader, twin = new_loader(table), new_loader(table)
    train_epochs(loader, 1)
    train_epochs(twin, 1)
    before = loader.state_dict()
    with pytest.raises(ValueError, match=match):
        loader.load_state_dict(state)
    assert loader.state_dict()[CHECKSUM] == before[CHECKSUM]  # the same content: nothing was loaded
    assert train_epochs(loader, 2) == train_epochs(twin, 2)  # and it trains on as if it had never seen it


@pytest.mark.parametrize("name", list(BAD))
def test_the_same_edit_with_the_checksum_kept_is_refused_as_changed(name):
    with pytest.raises(ValueError, match=CHANGED + r".*edited by hand"):
        new_loader(BAD[name][0]).load_state_dict(edited(name, keep_checksum=True))


def test_the_unedited_states_load():
    """The table's states before their edits load (with or without their checksum), so each
    refusal above is its edit's."""
    for table in (R, S, U):
        new_loader(table).load_state_dict(saved(table))
        new_loader(table).load_state_dict({k: v for k, v in saved(table).items() if k != CHECKSUM})


# -- a state changed on disk ---------------------------------------------------------------


def flip_a_byte_of(path, tensor, at):
    """Flip one bit of ``tensor``'s entry ``at`` where ``torch.save`` wrote it in ``path``."""
    data = bytearray(path.read_bytes())
    raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    start = data.find(raw)
    assert start >= 0 and data.find(raw, start + 1) < 0  # the tensor's bytes, found once
    data[start + at * tensor.element_size() + tensor.element_size() - 2] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("table", [R, S])
def test_a_weight_changed_on_disk_is_refused_by_the_checksum(tmp_path, table):
    state = saved(table)
    path = tmp_path / "loader.pt"
    torch.save(state, path)
    at = first_id(state)
    flip_a_byte_of(path, weights(state), at)
    changed = torch.load(path, weights_only=True)  # the file still loads: nothing in it notices
    assert weights(changed)[at] != weights(state)[at]
    with pytest.raises(ValueError, match=CHANGED):
        new_loader(table).load_state_dict(changed)


def test_a_state_without_a_checksum_resumes_as_the_state_with_it():
    """A state written before checksums existed has none: it loads, and resumes the same run."""
    state = saved(R)
    sealed, older = new_loader(R), new_loader(R)
    sealed.load_state_dict(state)
    older.load_state_dict({k: v for k, v in state.items() if k != CHECKSUM})
    assert train_epochs(sealed, 2) == train_epochs(older, 2)


@pytest.mark.parametrize("checksum", ["sha256:" + "0" * 64, "md5:abc", 7])
def test_a_checksum_that_is_not_the_contents_is_refused(checksum):
    with pytest.raises(ValueError, match="checksum"):
        new_loader(R).load_state_dict({**saved(R), CHECKSUM: checksum})
