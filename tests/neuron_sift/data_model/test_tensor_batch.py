"""TensorBatch: samples along dimension 0 of inputs and labels."""

import pytest
import torch

import neuron_sift
from neuron_sift.data_model.data_model_interface import SiftingBatch
from neuron_sift.data_model.tensor_batch import TensorBatch
from neuron_sift.exceptions import UnsupportedDataFormatException


def _batch(n=6, with_labels=True):
    inputs = torch.arange(n * 3, dtype=torch.float32).view(n, 3)
    labels = torch.arange(n) * 10 if with_labels else None
    return TensorBatch(inputs, labels)


def test_is_a_sifting_batch_at_the_smart_sifting_path():
    assert neuron_sift.TensorBatch is TensorBatch
    assert isinstance(_batch(), SiftingBatch)
    assert len(_batch(4)) == 4


@pytest.mark.parametrize(
    "indices", [[4, 0, 2], (1,), range(3, 6), torch.tensor([5, 1]), torch.tensor([2], dtype=torch.int32)]
)
def test_select_rows_in_the_given_order(indices):
    b = _batch()
    s = b.select(indices)
    rows = [int(i) for i in indices]
    assert isinstance(s, TensorBatch)
    assert len(s) == len(rows)
    assert s.inputs.tolist() == [b.inputs[i].tolist() for i in rows]
    assert s.labels.tolist() == [int(b.labels[i]) for i in rows]
    assert s.inputs.dtype == torch.float32 and s.labels.dtype == torch.int64


def test_select_does_not_alias_the_source():
    b = _batch()
    s = b.select([0, 1])
    s.inputs.zero_()
    assert b.inputs[0, 1] == 1.0


@pytest.mark.parametrize("with_labels", [True, False])
def test_empty_selection(with_labels):
    b = _batch(with_labels=with_labels)
    for empty in ([], torch.tensor([], dtype=torch.long)):
        s = b.select(empty)
        assert len(s) == 0
        assert s.inputs.shape == (0, 3) and s.inputs.dtype == torch.float32
        if with_labels:
            assert s.labels.shape == (0,)
        else:
            assert s.labels is None


def test_multi_dimensional_samples():
    x = torch.randn(5, 2, 3, 4)
    y = torch.randn(5, 7)
    s = TensorBatch(x, y).select([4, 1])
    assert torch.equal(s.inputs, x[[4, 1]])
    assert torch.equal(s.labels, y[[4, 1]])


def test_concat_in_order():
    b = _batch()
    out = b.select([5]).concat([b.select([0, 3]), b.select([]), b.select([1])])
    assert len(out) == 4
    assert out.labels.tolist() == [50, 0, 30, 10]
    assert torch.equal(out.inputs, b.inputs[[5, 0, 3, 1]])


def test_concat_with_nothing():
    b = _batch()
    out = b.concat([])
    assert torch.equal(out.inputs, b.inputs) and torch.equal(out.labels, b.labels)


def test_concat_without_labels():
    b = _batch(with_labels=False)
    out = b.concat([b])
    assert out.labels is None and out.inputs.shape == (12, 3)


@pytest.mark.parametrize("first_has_labels", [True, False])
def test_concat_label_presence_mismatch(first_has_labels):
    a, b = _batch(with_labels=True), _batch(with_labels=False)
    if not first_has_labels:
        a, b = b, a
    with pytest.raises(UnsupportedDataFormatException, match="labels"):
        a.concat([b])


def test_concat_input_shape_mismatch():
    a = TensorBatch(torch.zeros(2, 3))
    b = TensorBatch(torch.zeros(2, 4))
    with pytest.raises(UnsupportedDataFormatException, match=r"\(4,\).*\(3,\)"):
        a.concat([b])
    with pytest.raises(UnsupportedDataFormatException):
        TensorBatch(torch.zeros(2, 3)).concat([TensorBatch(torch.zeros(2, 3, 1))])


def test_concat_label_shape_mismatch():
    a = TensorBatch(torch.zeros(2, 3), torch.zeros(2, 5))
    b = TensorBatch(torch.zeros(2, 3), torch.zeros(2, 6))
    with pytest.raises(UnsupportedDataFormatException, match="label"):
        a.concat([b])


def test_concat_with_another_kind_of_batch():
    from neuron_sift.data_model.list_batch import ListBatch

    with pytest.raises(UnsupportedDataFormatException, match="ListBatch"):
        _batch().concat([ListBatch([1])])


def test_labels_count_mismatch():
    with pytest.raises(UnsupportedDataFormatException, match="3 inputs but 2 labels"):
        TensorBatch(torch.zeros(3, 2), torch.zeros(2))


@pytest.mark.parametrize("bad", [torch.tensor(1.0), [1.0, 2.0], None, "x"])
def test_inputs_must_be_a_tensor_with_a_sample_dimension(bad):
    with pytest.raises(UnsupportedDataFormatException, match="TensorBatch.inputs"):
        TensorBatch(bad)


@pytest.mark.parametrize("bad", [torch.tensor(1.0), [1.0, 2.0], "x"])
def test_labels_must_be_a_tensor_with_a_sample_dimension(bad):
    with pytest.raises(UnsupportedDataFormatException, match="TensorBatch.labels"):
        TensorBatch(torch.zeros(2), bad)
