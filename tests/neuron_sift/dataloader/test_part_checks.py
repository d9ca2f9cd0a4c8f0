"""Each part of the per-batch loader's state checks its own state, and the loader checks
every part's before it loads any: a state damaged in any one part is refused with a
``ValueError`` naming the field, and the loader's ``state_dict()`` is exactly what it was."""

import pytest
import torch

from neuron_sift.shared.checkpoints import CHECKSUM
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.dataloader.test_state_dict import make, run


def saved_state(stop):
    loader, sampler = make("probabilistic")
    run(loader, sampler, stop_after=stop)
    return loader.state_dict()


def same(a, b):
    """``a`` and ``b`` hold the same values (tensors compared with ``torch.equal``)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def damage_pending_size(state):
    assert state["pending"] is not None and state["pending"]["kind"] == "default"
    state["pending"]["size"] = str(state["pending"]["size"])


def damage_pending_leaves(state):
    """A leaf of the pending samples dropped: the kind, size and count still agree, so only
    restoring the samples finds it (before any part of the loader loads)."""
    state["pending"]["leaves"] = state["pending"]["leaves"][:1]


# part -> (the damage, the field the refusal names); each part's damage in a field of its own
DAMAGES = {
    "loader": (lambda s: s["loader"].__setitem__("batch_size", 16.0), "loader.batch_size"),
    "sift_state": (lambda s: s["sift_state"].__setitem__("pos", torch.tensor(40)), "sift_state.pos"),
    "sift_state-dtype": (
        lambda s: s["sift_state"].__setitem__("history", s["sift_state"]["history"].double()),
        "sift_state.history",
    ),
    "sift_state-kept": (lambda s: s["sift_state"].__setitem__("num_kept", torch.tensor(10**6)), "sift_state.num_kept"),
    "counts": (lambda s: s["counts"].__setitem__("num_samples_emitted", -1), "counts.num_samples_emitted"),
    "counts-type": (lambda s: s["counts"].__setitem__("num_source_batches", "7"), "counts.num_source_batches"),
    "delay": (lambda s: s["delay"].__setitem__("progress", "3"), "delay.progress"),
    "epoch": (lambda s: s["epoch"].__setitem__("consumed", -1), "epoch.consumed"),
    "epoch-type": (lambda s: s["epoch"].__setitem__("in_progress", 1), "epoch.in_progress"),
    "agreement": (lambda s: s["agreement"].__setitem__("budget_left", -2), "agreement.budget_left"),
    "pending": (damage_pending_size, "pending.size"),
    "pending-leaves": (damage_pending_leaves, "pending"),
}


@pytest.fixture(scope="module")
def good():
    return saved_state(9)


def test_the_undamaged_state_loads(good):
    loader, sampler = make("probabilistic")
    run(loader, sampler, stop_after=2)
    before = loader.state_dict()
    # the parts a load changes (one process agrees on nothing: its agreement stays 0, 0)
    assert not any(same(before[part], good[part]) for part in ("sift_state", "counts", "delay", "epoch", "pending"))
    loader.load_state_dict(roundtrip(good))
    assert same(loader.state_dict(), good)


@pytest.mark.parametrize("part", sorted(DAMAGES))
def test_a_state_damaged_in_one_part_is_refused_and_changes_nothing(good, part):
    damage, field = DAMAGES[part]
    state = roundtrip(good)
    state.pop(CHECKSUM)  # as a state of a version before checksums: the parts' checks judge it
    damage(state)
    loader, sampler = make("probabilistic")
    run(loader, sampler, stop_after=2)  # a loader with a state of its own, unlike the saved one's in every part
    before = loader.state_dict()
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        loader.load_state_dict(state)
    assert same(loader.state_dict(), before)
