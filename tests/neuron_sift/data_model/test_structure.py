"""The public structure and leaves API of a parsed default batch.

``BatchStructure.signature()`` is stored in checkpoints: the expected values below are
written out literally, in the format checkpoints have always used, so that a change of
format fails here before it fails to resume a saved run.
"""

import ast
import collections
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BatchEncoding

import neuron_sift
from neuron_sift.data_model.default_batch import DefaultBatchTransform, DefaultSiftingBatch
from neuron_sift.data_model.leaves import Leaf
from neuron_sift.data_model.structure import BatchStructure
from neuron_sift.exceptions import UnsupportedDataFormatException

from .test_default_batch import assert_same

B = 4

Triple = collections.namedtuple("Triple", ["x", "names", "extra"])


def t(*shape):
    return torch.randn(B, *shape)


# (batch, signature in the checkpoint format, leaf paths)
CASES = [
    pytest.param((t(3), t()), ["seq", [["leaf"], ["leaf"]]], ("[0]", "[1]"), id="tuple-of-tensors"),
    pytest.param(t(3), ["leaf"], ("",), id="bare-tensor"),
    pytest.param(np.zeros((B, 2)), ["leaf"], ("",), id="bare-array"),
    pytest.param([("a", 1)] * B, ["leaf"], ("",), id="list-of-samples"),
    pytest.param(
        {"x": t(3), "meta": {"ids": t(), "names": ["a"] * B}, "pair": (t(), t(2))},
        [
            "map",
            ["x", "meta", "pair"],
            [["leaf"], ["map", ["ids", "names"], [["leaf"], ["leaf"]]], ["seq", [["leaf"], ["leaf"]]]],
        ],
        ("['x']", "['meta']['ids']", "['meta']['names']", "['pair'][0]", "['pair'][1]"),
        id="nested-dict",
    ),
    pytest.param(
        Triple(t(3), ["s"] * B, {"k": t(), 3: np.zeros((B, 2))}),
        ["seq", [["leaf"], ["leaf"], ["map", ["k", "3"], [["leaf"], ["leaf"]]]]],
        ("[0]", "[1]", "[2]['k']", "[2][3]"),
        id="namedtuple",
    ),
    pytest.param(
        [[t(), t()], (t(1), {"q": t()})],
        ["seq", [["seq", [["leaf"], ["leaf"]]], ["seq", [["leaf"], ["map", ["q"], [["leaf"]]]]]]],
        ("[0][0]", "[0][1]", "[1][0]", "[1][1]['q']"),
        id="nested-lists",
    ),
    pytest.param(
        BatchEncoding({"input_ids": t(7), "attention_mask": t(7)}),
        ["map", ["input_ids", "attention_mask"], [["leaf"], ["leaf"]]],
        ("['input_ids']", "['attention_mask']"),
        id="mapping-subclass",
    ),
]


@pytest.mark.parametrize("batch,signature,paths", CASES)
def test_signature_keeps_the_checkpoint_format(batch, signature, paths):
    parsed = DefaultBatchTransform(B).transform(batch)
    assert parsed.structure.signature() == signature
    assert parsed.structure.leaf_paths() == paths
    assert len(parsed.leaves) == len(paths)


@pytest.mark.parametrize("batch,signature,paths", CASES)
def test_signature_survives_json_and_weights_only_loading(batch, signature, paths):
    sig = DefaultBatchTransform(B).transform(batch).structure.signature()
    assert json.loads(json.dumps(sig)) == sig
    buf = io.BytesIO()
    torch.save({"signature": sig}, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["signature"] == sig


@pytest.mark.parametrize("batch,signature,paths", CASES)
def test_build_round_trips_the_users_batch(batch, signature, paths):
    parsed = DefaultBatchTransform(B).transform(batch)
    assert_same(parsed.structure.build(parsed.leaves), batch)
    # The same structure over other leaves: what the device pending store and checkpoints do.
    rebuilt = DefaultSiftingBatch(parsed.structure, [leaf.select([1, 0]) for leaf in parsed.leaves], 2)
    assert_same(rebuilt.to_user(), DefaultBatchTransform(B).reverse_transform(parsed.select([1, 0])))
    assert_same(parsed.with_leaves(list(parsed.leaves), len(parsed)).to_user(), batch)


def test_structure_holds_container_types_not_the_users_containers():
    batch = Triple(t(3), ["s"] * B, {"k": t()})
    s = DefaultBatchTransform(B).transform(batch).structure
    assert s.kind == "seq" and s.container is Triple and s.index == -1
    assert [c.kind for c in s.children] == ["leaf", "leaf", "map"]
    assert [c.index for c in s.children[:2]] == [0, 1]
    assert s.children[2].container is dict and s.children[2].keys == ("k",)


def test_equality_is_the_shape_without_container_types():
    """Batches with the same fields join whatever their container types (the first one's win)."""
    as_tuple = DefaultBatchTransform(B).transform((t(), ["a"] * B)).structure
    as_list = DefaultBatchTransform(B).transform([t(), ["a"] * B]).structure
    assert as_tuple.container is tuple and as_list.container is list
    assert as_tuple == as_list and hash(as_tuple) == hash(as_list) and as_tuple.same_shape(as_list)
    other_keys = DefaultBatchTransform(B).transform({"x": t(), "z": t()}).structure
    keys = DefaultBatchTransform(B).transform({"x": t(), "y": t()}).structure
    assert not keys.same_shape(other_keys) and keys != other_keys
    assert keys.same_shape(DefaultBatchTransform(B).transform({"x": t(2), "y": t()}).structure)


def test_batches_of_tensor_fields_share_one_structure_object():
    """The common batch compares by identity when joined: one node per (type, field count)."""
    transform = DefaultBatchTransform(B)
    first, second = transform.transform((t(3), t())), transform.transform((t(3), t()))
    assert first.structure is second.structure is BatchStructure.fields(tuple, 2)
    assert first.concat([second]).structure is first.structure
    assert transform.transform([t(3), t()]).structure is not first.structure  # another container type


def test_structure_constructors_check_and_freeze():
    with pytest.raises(ValueError, match="2 keys for 1 children"):
        BatchStructure.mapping(dict, ["a", "b"], [BatchStructure.leaf(0)])
    s = BatchStructure.mapping(dict, ["a"], [BatchStructure.leaf(0)])
    with pytest.raises(AttributeError):
        s.kind = "seq"  # type: ignore[misc]
    assert s.build([Leaf(torch.zeros(2))])["a"].shape == (2,)


def test_rebuilding_an_unbuildable_mapping_type_says_so():
    class Strict(collections.abc.Mapping):
        def __init__(self, a, b):
            self._d = {"a": a, "b": b}

        def __getitem__(self, k):
            return self._d[k]

        def __iter__(self):
            return iter(self._d)

        def __len__(self):
            return len(self._d)

    parsed = DefaultBatchTransform(B).transform(Strict(t(), t()))
    with pytest.raises(UnsupportedDataFormatException, match="cannot rebuild a batch of type"):
        parsed.to_user()


# -- Leaf ------------------------------------------------------------------------------------


def test_leaf_api():
    x = torch.arange(12.0).view(3, 4)  # samples along dimension 1
    leaf = Leaf(x, axis=1)
    assert leaf.value is x and leaf.axis == 1 and leaf.size() == 4
    view = leaf.select(range(1, 3))
    assert view.value.data_ptr() == x[:, 1].data_ptr() and view.size() == 2  # a view, no copy
    picked = leaf.select([3, 0])
    assert torch.equal(picked.value, x[:, [3, 0]]) and picked.axis == 1
    assert torch.equal(leaf.select(torch.tensor([2])).value, x[:, [2]])
    joined = Leaf.concat([picked, view], path="['x']")
    assert torch.equal(joined.value, torch.cat([x[:, [3, 0]], x[:, 1:3]], dim=1)) and joined.size() == 4

    names = Leaf(("a", "b", "c"))
    assert names.size() == 3 and names.select([2, 0]).value == ("c", "a")
    assert Leaf.concat([names, Leaf(("d",))], path="").value == ("a", "b", "c", "d")
    arr = Leaf(np.arange(6).reshape(3, 2))
    assert np.array_equal(arr.select([2, 1]).value, np.array([[4, 5], [2, 3]]))


def test_leaf_concat_names_the_field_in_errors():
    with pytest.raises(UnsupportedDataFormatException, match=r"field \['x'\]\[1\]: a list after a Tensor"):
        Leaf.concat([Leaf(torch.zeros(2)), Leaf(["a"])], path="['x'][1]")
    with pytest.raises(UnsupportedDataFormatException, match=r"field <batch>: per-sample shape \(3,\)"):
        Leaf.concat([Leaf(torch.zeros(2, 2), axis=1), Leaf(torch.zeros(3, 2), axis=1)], path="")


# -- no private access from outside the data model --------------------------------------------

_PRIVATE_USE = re.compile(r"\._spec\b|\._leaves\b|\b_Leaf\b|\bspec_signature\b")


def test_no_module_outside_the_data_model_reads_its_privates():
    """Other modules use the public structure/leaves API, so the data model can change inside."""
    package = Path(neuron_sift.__file__).parent
    data_model = package / "data_model"
    offences = []
    for path in sorted(package.rglob("*.py")):
        if data_model in path.parents:
            continue
        source = path.read_text()
        for lineno, line in enumerate(source.splitlines(), 1):
            if _PRIVATE_USE.search(line):
                offences.append(f"{path.relative_to(package)}:{lineno}: {line.strip()}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("neuron_sift.data_model"):
                offences += [
                    f"{path.relative_to(package)}:{node.lineno}: imports {a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    assert not offences, "\n".join(offences)
