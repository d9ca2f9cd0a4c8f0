"""The checkpoint envelope (``neuron_sift.shared.checkpoints``): a state names its kind and
version, a reader reads it exactly or refuses it naming what it got. First on formats of
the test's own, then on the two loaders, whose states both say version 2 so only the kind
tells them apart."""

import io

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader, Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.shared import checkpoints
from neuron_sift.shared.checkpoints import CHECKSUM, StateFormat, content_checksum, require, state_kind


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    """Formats made here register for ``state_kind``: keep them out of every other test."""
    monkeypatch.setattr(checkpoints, "_FORMATS", list(checkpoints._FORMATS))


def widget(**kw):
    return StateFormat("Widget", 3, ("a", "b"), **kw)


def test_write_then_read_is_the_identity_through_torch_save():
    fmt = widget()
    state = fmt.write({"a": 1, "b": {"x": torch.arange(3)}})
    assert state["kind"] == "Widget" and state["version"] == 3
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    back = fmt.read(torch.load(buf, weights_only=True))
    assert back["a"] == 1 and torch.equal(back["b"]["x"], torch.arange(3))
    assert state_kind(back) == "Widget"


def test_a_writer_that_forgets_a_part_is_a_bug():
    with pytest.raises(AssertionError, match="Widget state written without b"):
        widget().write({"a": 1})


def test_another_kind_is_refused_naming_it():
    with pytest.raises(
        ValueError,
        match=r"not a Widget state: it comes from Gadget\.state_dict\(\); load it with Gadget\.load_state_dict\(\) "
        r"\(a Widget reads only what Widget\.state_dict\(\) returns\)",
    ):
        widget().read({"kind": "Gadget", "version": 3, "a": 1, "b": 2})
    with pytest.raises(ValueError, match=r"not an Item state: it comes from Widget"):
        StateFormat("Item", 1, ()).read(widget().write({"a": 1, "b": 2}))


def test_what_is_no_state_at_all_is_refused_saying_what_it_is():
    with pytest.raises(ValueError, match="got a dict of version 3 with neither a kind nor this kind's parts"):
        widget().read({"version": 3, "a": 1, "b": 2})
    with pytest.raises(ValueError, match="got a list that is no loader's state"):
        widget().read([1, 2])
    with pytest.raises(ValueError, match="got a dict that is no loader's state"):
        widget().read({"a": 1, "b": 2})


@pytest.mark.parametrize("version", [2, 4, None, "3"])
def test_an_unreadable_version_is_refused_naming_the_readable_ones(version):
    fmt = widget(upgrades={1: lambda s: s})
    with pytest.raises(
        ValueError,
        match=rf"not a Widget state of a version this neuron_sift reads: version {version!r}; "
        r"readable versions: 1, 3 \(current 3\)",
    ):
        fmt.read({"kind": "Widget", "version": version, "a": 1, "b": 2})


def test_an_old_version_is_upgraded_and_a_current_one_is_not():
    calls = []

    def from_v1(state):
        calls.append(state["version"])
        return {"kind": "Widget", "version": 3, "a": state["old_a"], "b": None}

    fmt = widget(upgrades={1: from_v1})
    assert fmt.readable_versions == (1, 3)
    assert fmt.read({"kind": "Widget", "version": 1, "old_a": 7}) == {"kind": "Widget", "version": 3, "a": 7, "b": None}
    fmt.read(fmt.write({"a": 1, "b": 2}))
    assert calls == [1]


def test_an_incomplete_state_is_refused_naming_what_it_lacks():
    with pytest.raises(ValueError, match="Widget state version 3 is incomplete: no b"):
        widget().read({"kind": "Widget", "version": 3, "a": 1})
    fmt = widget(upgrades={1: lambda s: {**s, "version": 3}})  # an upgrade that leaves a part out
    with pytest.raises(ValueError, match="Widget state version 1 is incomplete: no a, b"):
        fmt.read({"kind": "Widget", "version": 1})


def test_a_state_from_before_kinds_were_saved_is_recognised_by_its_keys():
    old = StateFormat(
        "Relic",
        2,
        ("p",),
        upgrades={1: lambda s: {"kind": "Relic", "version": 2, "p": s["relic_position"]}},
        legacy=lambda s: "relic_position" in s or "relic_p" in s,
        unversioned=1,
    )
    assert state_kind({"relic_position": 4}) == "Relic"
    assert old.read({"relic_position": 4})["p"] == 4  # no version saved: read as ``unversioned``
    assert old.read({"relic_p": 5, "version": 2, "p": 5})["p"] == 5  # a version saved, no kind
    with pytest.raises(ValueError, match="it comes from Relic"):
        widget().read({"relic_position": 4})
    strict = StateFormat("Fossil", 2, ("q",), legacy=lambda s: "fossil_q" in s)  # no ``unversioned``
    with pytest.raises(ValueError, match="version None; readable versions: 2"):
        strict.read({"fossil_q": 1})


def test_state_kind_of_what_names_none():
    assert state_kind([1]) is None and state_kind(None) is None
    assert state_kind({"version": 2}) is None
    assert state_kind({"kind": 3}) is None  # a kind must be a class name


def test_require_names_every_missing_key():
    require({"a": 1, "b": 2}, ("a", "b"), "the plan")
    with pytest.raises(ValueError, match="the plan is incomplete: no b, c"):
        require({"a": 1}, ("a", "b", "c"), "the plan")


# --- the two loaders ---------------------------------------------------------------------


class Score(Loss):
    def loss(self, model, transformed_batch, original_batch=None):
        return transformed_batch[0].float()


def source():
    return DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4)


def per_batch():
    cfg = RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=8, selection_mode="fixed", seed=0)
    return SiftingDataloader(sift_config=cfg, orig_dataloader=source(), loss_impl=Score(), model=torch.nn.Identity())


def epoch_level():
    return EpochSiftingDataloader({"seed": 0, "kept_share": 0.5}, source(), num_epochs=2)


def test_each_loader_state_names_its_kind():
    assert state_kind(per_batch().state_dict()) == "SiftingDataloader"
    assert state_kind(epoch_level().state_dict()) == "EpochSiftingDataloader"


def test_an_epoch_state_into_the_per_batch_loader():
    state = epoch_level().state_dict()
    state["version"] = per_batch().state_dict()["version"]  # the version alone cannot tell them apart
    with pytest.raises(
        ValueError,
        match=r"not a SiftingDataloader state: it comes from EpochSiftingDataloader\.state_dict\(\); "
        r"load it with EpochSiftingDataloader\.load_state_dict\(\)",
    ):
        per_batch().load_state_dict(state)


def test_a_per_batch_state_into_the_epoch_loader():
    with pytest.raises(
        ValueError,
        match=r"not an EpochSiftingDataloader state: it comes from SiftingDataloader\.state_dict\(\); "
        r"load it with SiftingDataloader\.load_state_dict\(\)",
    ):
        epoch_level().load_state_dict(per_batch().state_dict())
    with pytest.raises(ValueError, match=r"not an EpochSiftingDataloader state: got a list that is no loader's state"):
        epoch_level().load_state_dict([1, 2])


def test_each_kind_still_loads_its_own_state():
    """A state taken mid-epoch loads into a new loader of its kind, which then holds the same
    state (the same checksum: the same content) and yields what the loader it came from yields."""

    def yielded(loader, batches, losses):
        out = []
        for (x,) in batches:
            out.append(x.tolist())
            if losses:
                loader.weighted_loss(x.float())
        return out

    for make, losses in ((per_batch, False), (epoch_level, True)):
        a, b = make(), make()
        it = iter(a)
        first = yielded(a, [next(it)], losses)
        state = a.state_dict()
        b.load_state_dict(state)
        assert b.state_dict()[CHECKSUM] == state[CHECKSUM]
        rest = yielded(a, it, losses)
        assert rest and first[0] not in rest
        assert yielded(b, b, losses) == rest  # the rest of the epoch, not a new one
        assert yielded(b, b, losses) == yielded(a, a, losses)  # and the next epoch alike


# --- the checksum --------------------------------------------------------------------------

CHANGED = r"the state's content does not match its checksum: it was changed after state_dict\(\) wrote it"


def test_a_state_carries_the_checksum_of_its_content_and_a_reader_verifies_it():
    fmt = widget()
    state = fmt.write({"a": 1, "b": {"x": torch.arange(3), "y": [1.5, "s", None, True]}})
    assert state[CHECKSUM] == content_checksum(state) and state[CHECKSUM].startswith("sha256:")
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    fmt.read(torch.load(buf, weights_only=True))  # through a file: the same content
    state["b"]["x"][1] = 7
    with pytest.raises(
        ValueError,
        match="a Widget state: " + CHANGED + r" \(a damaged or truncated file, or a state "
        r"edited by hand\)",
    ):
        fmt.read(state)
    fmt.read(state, verify=False)  # a reader that only compares fields may skip it
    del state[CHECKSUM]
    fmt.read(state)  # a state of a version before checksums: read as before


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["b"].update(x=s["b"]["x"].to(torch.int32)),  # the dtype
        lambda s: s["b"].update(x=s["b"]["x"].reshape(1, 3)),  # the shape
        lambda s: s["b"].update(y=tuple(s["b"]["y"])),  # a list made a tuple
        lambda s: s["b"]["y"].__setitem__(0, 1),  # a float made an int
        lambda s: s["b"]["y"].__setitem__(3, 1),  # a bool made an int
        lambda s: s.update(a=-1),
        lambda s: s["b"].update(z=None),  # a key added
    ],
)
def test_any_change_of_type_shape_or_value_changes_the_checksum(change):
    fmt = widget()
    state = fmt.write({"a": 1, "b": {"x": torch.arange(3), "y": [1.5, "s", None, True]}})
    change(state)
    with pytest.raises(ValueError, match=CHANGED):
        fmt.read(state)


@pytest.mark.parametrize("make", [lambda v: torch.tensor([v]), lambda v: torch.tensor(v), lambda v: np.array([v])])
def test_a_one_element_tensor_is_part_of_the_checksum(make):
    """A single count or scalar kept as a tensor (a history's fill, a one-element vector on
    XLA) is content like any other."""
    assert content_checksum({"a": make(1.0)}) != content_checksum({"a": make(2.0)})
    assert content_checksum({"a": make(0.0)}) != content_checksum({"a": make(-0.0)})


def test_the_checksum_does_not_depend_on_the_order_of_keys():
    x = torch.arange(4.0)
    assert content_checksum({"a": 1, "b": x}) == content_checksum({"b": x.clone(), "a": 1})


def test_a_nested_state_enters_its_holders_checksum_by_its_own():
    """A wrapper's state holding its loader's: the inner state's bytes are hashed once, when
    the inner state is written, and verified by its own reader."""
    inner_fmt, outer_fmt = widget(), StateFormat("Holder", 1, ("inner",))
    inner = inner_fmt.write({"a": 1, "b": torch.arange(3)})
    outer = outer_fmt.write({"inner": inner})
    inner["b"][0] = 9  # changed: its own checksum no longer matches
    outer_fmt.read(outer)
    with pytest.raises(ValueError, match=CHANGED):
        inner_fmt.read(outer["inner"])
    outer["inner"] = {**inner, CHECKSUM: content_checksum(inner)}  # its checksum changed too: the holder's sees it
    with pytest.raises(ValueError, match="a Holder state: " + CHANGED):
        outer_fmt.read(outer)


@pytest.mark.parametrize("saved", ["sha256:0", "crc32:1", 5])
def test_a_checksum_of_another_form_is_refused(saved):
    state = {**widget().write({"a": 1, "b": 2}), CHECKSUM: saved}
    with pytest.raises(ValueError, match="checksum"):
        widget().read(state)


def test_a_per_batch_state_changed_on_disk_is_refused(tmp_path):
    """One flipped bit in a tensor of the file: torch.load reads it without a word, the loader refuses it."""
    a = per_batch()
    it = iter(a)
    next(it)
    state = a.state_dict()
    path = tmp_path / "loader.pt"
    torch.save(state, path)
    tensors = [t for t in state["sift_state"].values() if t.numel() > 2 and t.is_floating_point()]
    raw = tensors[0].contiguous().view(torch.uint8).numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(raw)
    assert at >= 0
    data[at + tensors[0].element_size() - 1] ^= 0x01
    path.write_bytes(bytes(data))
    changed = torch.load(path, weights_only=True)
    assert any(not torch.equal(changed["sift_state"][k], state["sift_state"][k]) for k in state["sift_state"])
    with pytest.raises(ValueError, match=CHANGED):
        per_batch().load_state_dict(changed)


def test_a_per_batch_state_of_another_rank_layout_is_refused_saying_each_rank_loads_its_own():
    state = per_batch().state_dict()
    state = {**state, "loader": {**state["loader"], "world_size": 2}}
    del state[CHECKSUM]  # as if a rank of a 2-rank run had written it
    with pytest.raises(
        ValueError,
        match=r"checkpoint was taken on rank 0 of 2 rank\(s\), this loader is rank 0 of 1: each rank loads the state "
        r"it saved, at the world size it saved it at \(SiftingDataloader does not resume at another world size",
    ):
        per_batch().load_state_dict(state)
