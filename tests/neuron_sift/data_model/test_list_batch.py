"""ListBatch: one list element per sample; select and concat keep the pairing of inputs and labels."""

import pytest
import torch

import neuron_sift
from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.list_batch import ListBatch
from neuron_sift.exceptions import UnsupportedDataFormatException


def _mixed_inputs():
    # Elements may be anything: tensors, tuples of tensors, strings, dicts.
    return [torch.tensor([1.0, 2.0]), (torch.tensor(3), torch.tensor([4, 5])), "text", {"k": 6}, None]


def test_is_a_sifting_batch_at_the_smart_sifting_path():
    assert neuron_sift.ListBatch is ListBatch
    assert isinstance(ListBatch([1]), SiftingBatch)


def test_attributes_are_lists():
    b = ListBatch((1, 2, 3), (4, 5, 6))
    assert b.inputs == [1, 2, 3] and isinstance(b.inputs, list)
    assert b.labels == [4, 5, 6] and isinstance(b.labels, list)
    assert len(b) == 3
    assert ListBatch([1, 2]).labels is None


def test_select_keeps_the_given_order_and_the_same_objects():
    inputs = _mixed_inputs()
    labels = ["a", "b", "c", "d", "e"]
    b = ListBatch(inputs, labels)
    s = b.select([3, 0, 4])
    assert isinstance(s, ListBatch)
    assert len(s) == 3
    assert s.inputs[0] is inputs[3] and s.inputs[1] is inputs[0] and s.inputs[2] is None
    assert s.labels == ["d", "a", "e"]
    # The source batch is unchanged.
    assert len(b) == 5 and b.labels == labels


def test_select_accepts_tensor_indices_and_ranges():
    b = ListBatch(list("abcdef"), list(range(6)))
    assert b.select(torch.tensor([5, 1])).inputs == ["f", "b"]
    assert b.select(range(2, 4)).labels == [2, 3]


def test_empty_selection():
    b = ListBatch(list("abc"), [1, 2, 3])
    s = b.select([])
    assert len(s) == 0 and s.inputs == [] and s.labels == []
    assert ListBatch(list("abc")).select([]).labels is None


def test_concat_in_order_and_sources_unchanged():
    a = ListBatch(["a0", "a1"], [0, 1])
    b = ListBatch(["b0"], [2])
    c = ListBatch(["c0", "c1", "c2"], [3, 4, 5])
    out = a.concat([b, c])
    assert out.inputs == ["a0", "a1", "b0", "c0", "c1", "c2"]
    assert out.labels == [0, 1, 2, 3, 4, 5]
    assert a.inputs == ["a0", "a1"] and a.labels == [0, 1]
    assert b.inputs == ["b0"]


def test_concat_with_nothing_and_with_empty_batches():
    a = ListBatch(["a"], [1])
    assert a.concat([]).inputs == ["a"]
    out = a.select([]).concat([a, a.select([])])
    assert out.inputs == ["a"] and out.labels == [1]


def test_concat_without_labels():
    out = ListBatch([1, 2]).concat([ListBatch([3])])
    assert out.inputs == [1, 2, 3] and out.labels is None


def test_select_then_concat_round_trip():
    inputs = [torch.full((2,), float(i)) for i in range(8)]
    b = ListBatch(inputs, list(range(8)))
    out = b.select([1, 4]).concat([b.select([0]), b.select([7, 6])])
    assert out.labels == [1, 4, 0, 7, 6]
    assert [float(t[0]) for t in out.inputs] == [1, 4, 0, 7, 6]


@pytest.mark.parametrize("first_has_labels", [True, False])
def test_concat_label_presence_mismatch(first_has_labels):
    with_labels = ListBatch([1], [0])
    without = ListBatch([2])
    a, b = (with_labels, without) if first_has_labels else (without, with_labels)
    with pytest.raises(UnsupportedDataFormatException, match="labels"):
        a.concat([b])


def test_concat_with_another_kind_of_batch():
    from neuron_sift.data_model.tensor_batch import TensorBatch

    with pytest.raises(UnsupportedDataFormatException, match="TensorBatch"):
        ListBatch([1]).concat([TensorBatch(torch.zeros(1))])


def test_labels_length_mismatch():
    with pytest.raises(UnsupportedDataFormatException, match="3 inputs but 2 labels"):
        ListBatch([1, 2, 3], [1, 2])


@pytest.mark.parametrize("bad", [torch.zeros(3), "abc", 5, {"a": 1}])
def test_inputs_must_be_a_list(bad):
    with pytest.raises(UnsupportedDataFormatException, match="ListBatch.inputs"):
        ListBatch(bad)


@pytest.mark.parametrize("bad", [torch.zeros(3), "abc", 5])
def test_labels_must_be_a_list_or_none(bad):
    with pytest.raises(UnsupportedDataFormatException, match="ListBatch.labels"):
        ListBatch([1, 2, 3], bad)
