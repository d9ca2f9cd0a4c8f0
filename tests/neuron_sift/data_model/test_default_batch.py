"""DefaultBatchTransform: the batch formats handled without a user transform.

The reference for every round trip is ``default_collate`` (or the user's own collation)
applied to exactly the selected samples: sifting must give the training loop the same
object it would have got had the source loader produced only those samples.
"""

import collections
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from transformers import BatchEncoding

import neuron_sift
from neuron_sift.data_model.data_model_interface import SiftingBatch, SiftingBatchTransform
from neuron_sift.data_model.default_batch import DefaultBatchTransform
from neuron_sift.exceptions import UnsupportedDataFormatException

B = 4

Point = collections.namedtuple("Point", ["x", "label"])


# -- helpers --------------------------------------------------------------------------------


def assert_same(got, want, path="batch"):
    """Equal values and the same types, all the way down."""
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert torch.equal(got, want), path
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert np.array_equal(got, want), path
    elif isinstance(want, Mapping):
        assert list(got.keys()) == list(want.keys()), path
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, path


def sift(transform, batches, selections, sizes=None):
    """Transform each source batch, keep ``selections[i]`` of batch i, accumulate, give back."""
    parts = []
    for i, (batch, sel) in enumerate(zip(batches, selections)):
        sb = transform.transform(batch)
        assert isinstance(sb, SiftingBatch)
        if sizes is not None:
            assert len(sb) == sizes[i]
        parts.append(sb.select(sel))
        assert len(parts[-1]) == len(sel)
    acc = parts[0].concat(parts[1:])
    assert len(acc) == sum(len(s) for s in selections)
    return transform.reverse_transform(acc)


def chunks(samples, size):
    return [samples[i : i + size] for i in range(0, len(samples), size)]


SELECTIONS = [[0, 2, 3], [1], [], [3, 0]]  # per source batch, any order, empty allowed


def selections_for(batches):
    out = []
    for i, b in enumerate(batches):
        n = len(b)
        out.append([j for j in SELECTIONS[i % len(SELECTIONS)] if j < n])
    return out


def run_case(samples, collate, batch_format_index=None):
    """Batches of B (last one short) through select -> concat -> reverse_transform."""
    sample_batches = chunks(samples, B)
    batches = [collate(s) for s in sample_batches]
    sels = selections_for(sample_batches)
    transform = DefaultBatchTransform(B, batch_format_index)
    got = sift(transform, batches, sels, sizes=[len(s) for s in sample_batches])
    want = collate([s[j] for s, sel in zip(sample_batches, sels) for j in sel])
    assert_same(got, want)
    return transform


# -- datasets ---------------------------------------------------------------------------------


def tensor_samples(n=10):
    return [torch.arange(3, dtype=torch.float32) + 10 * i for i in range(n)]


def tuple_samples(n=10):
    return [(torch.arange(3, dtype=torch.float32) + 10 * i, i, f"s{i}") for i in range(n)]


def dict_samples(n=10):
    return [
        {
            "x": torch.full((2, 2), float(i)),
            "meta": {"id": i, "name": f"n{i}", "inner": {"w": torch.tensor([i, -i])}},
            "tags": f"t{i}",
            "pair": [torch.tensor(i), torch.tensor(100 + i)],
        }
        for i in range(n)
    ]


# -- supported formats ------------------------------------------------------------------------


def test_exported_and_is_a_transform():
    assert neuron_sift.DefaultBatchTransform is DefaultBatchTransform
    assert isinstance(DefaultBatchTransform(), SiftingBatchTransform)


def test_tensor_batches():
    run_case(tensor_samples(), default_collate)


def test_tuple_dataset_collated_feature_major():
    # default_collate of (tensor, int, str) samples: [tensor[B, 3], tensor[B], tuple of B strings].
    t = run_case(tuple_samples(), default_collate)
    batch = default_collate(tuple_samples(B))
    assert len(t.transform(batch)) == B


def test_tuple_batches_stay_tuples():
    samples = tuple_samples()
    run_case(samples, lambda s: tuple(default_collate(s)))


def test_list_of_samples_sample_major():
    # collate_fn=lambda b: b: the batch is the list of samples itself.
    run_case(tuple_samples(), lambda s: list(s))


def test_list_of_strings():
    run_case([f"sentence {i}" for i in range(10)], lambda s: list(s))


def test_dicts_nested_with_strings_and_lists():
    run_case(dict_samples(), default_collate)


def test_namedtuple_batch():
    samples = [Point(torch.tensor([float(i), -float(i)]), i) for i in range(10)]
    run_case(samples, default_collate)
    out = sift(DefaultBatchTransform(B), [default_collate(samples[:B])], [[2]])
    assert isinstance(out, Point) and out.label.tolist() == [2]


def test_batch_encoding():
    def collate(samples):
        return BatchEncoding(
            {
                "input_ids": torch.stack([s["input_ids"] for s in samples])
                if samples
                else torch.zeros(0, 5, dtype=torch.long),
                "attention_mask": torch.stack([s["attention_mask"] for s in samples])
                if samples
                else torch.zeros(0, 5, dtype=torch.long),
                "labels": torch.tensor([s["labels"] for s in samples], dtype=torch.long),
            }
        )

    samples = [
        {"input_ids": torch.arange(5) + 10 * i, "attention_mask": (torch.arange(5) < i % 5 + 1).long(), "labels": i % 2}
        for i in range(10)
    ]
    run_case(samples, collate)
    out = sift(DefaultBatchTransform(B), [collate(samples[:B])], [[3, 1]])
    assert isinstance(out, BatchEncoding)
    assert out.input_ids.tolist() == [samples[3]["input_ids"].tolist(), samples[1]["input_ids"].tolist()]


def test_numpy_array_batch():
    samples = [np.arange(3, dtype=np.float64) + i for i in range(10)]
    run_case(samples, lambda s: np.stack(s) if s else np.zeros((0, 3)))


def test_numpy_arrays_in_lists_and_dicts():
    def collate_list(s):
        return [
            np.stack([x for x, _ in s]) if s else np.zeros((0, 2), np.int32),
            np.array([y for _, y in s], dtype=np.int64),
        ]

    samples = [(np.array([i, i + 1], dtype=np.int32), i) for i in range(10)]
    run_case(samples, collate_list)

    def collate_dict(s):
        return {"x": collate_list(s)[0], "y": collate_list(s)[1], "id": [f"id{y}" for _, y in s]}

    run_case(samples, collate_dict)


def test_select_does_not_change_the_source_batch():
    batch = default_collate(tuple_samples(B))
    snapshot = [batch[0].clone(), batch[1].clone(), tuple(batch[2])]
    t = DefaultBatchTransform(B)
    t.reverse_transform(t.transform(batch).select([1]))
    assert_same(batch, [snapshot[0], snapshot[1], snapshot[2]])


def test_full_selection_is_identity():
    batch = default_collate(dict_samples(B))
    t = DefaultBatchTransform(B)
    assert_same(t.reverse_transform(t.transform(batch).select(range(B))), batch)


@pytest.mark.parametrize(
    "make",
    [
        lambda: default_collate(tensor_samples(B)),
        lambda: default_collate(tuple_samples(B)),
        lambda: list(tuple_samples(B)),
        lambda: default_collate(dict_samples(B)),
        lambda: np.zeros((B, 3)),
    ],
)
def test_empty_selection_gives_zero_rows_of_the_same_types(make):
    batch = make()
    t = DefaultBatchTransform(B)
    out = t.reverse_transform(t.transform(batch).select([]))
    assert type(out) is type(batch)
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        assert out.shape == (0,) + tuple(batch.shape[1:])
    elif isinstance(batch, dict):
        assert out["x"].shape == (0, 2, 2) and out["tags"] == [] and out["meta"]["name"] == []
    elif isinstance(batch[0], torch.Tensor):
        assert out[0].shape == (0, 3) and out[1].shape == (0,) and out[2] == ()
    else:
        assert out == []


def test_tensor_indices_are_accepted():
    batch = default_collate(dict_samples(B))
    t = DefaultBatchTransform(B)
    out = t.reverse_transform(t.transform(batch).select(torch.tensor([3, 0])))
    assert out["tags"] == ["t3", "t0"]
    assert out["meta"]["inner"]["w"].tolist() == [[3, -3], [0, 0]]


def test_batch_size_unknown_uses_the_shape():
    # No nominal batch size: a collated tuple dataset is still read by feature.
    t = DefaultBatchTransform(None)
    batch = default_collate(tuple_samples(5))
    assert len(t.transform(batch)) == 5
    t = DefaultBatchTransform(None)
    assert len(t.transform(torch.zeros(6, 6))) == 6


# -- the documented errors ----------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize("batch", [3, 2.5, "a string", None, {1, 2}, Opaque(), b"bytes"])
def test_unsupported_type(batch):
    with pytest.raises(UnsupportedDataFormatException) as info:
        DefaultBatchTransform(B).transform(batch)
    assert f"Batches of type {type(batch)} are not supported by default." in str(info.value)
    assert "batch_transforms" in str(info.value)


@pytest.mark.parametrize(
    "batch",
    [torch.tensor(1.0), np.array(1.0), {}, {"x": torch.tensor(2.0)}, {"x": torch.zeros(B), "y": torch.zeros(B - 1)}],
)
def test_unable_to_index(batch):
    with pytest.raises(UnsupportedDataFormatException) as info:
        DefaultBatchTransform(B).transform(batch)
    assert f"Unable to index the batch of type {type(batch)}" in str(info.value)


def test_unable_to_index_a_field_without_sample_dimension():
    # A scalar beside the per-sample fields (e.g. an epoch number) cannot be split by sample.
    with pytest.raises(UnsupportedDataFormatException) as info:
        DefaultBatchTransform(B).transform({"x": torch.zeros(B), "epoch": 3})
    msg = str(info.value)
    assert "Unable to index the batch of type" in msg and "'epoch'" in msg


@pytest.mark.parametrize(
    "batch",
    [
        [torch.zeros(5, 3), torch.zeros(5)],  # 2 fields of 5 samples, batch size 4
        [torch.zeros(6)] * 5,
    ],
)
def test_batch_size_matches_neither_dimension(batch):
    with pytest.raises(UnsupportedDataFormatException) as info:
        DefaultBatchTransform(B).transform(batch)
    assert f"Batch size {B} does not match dimension 0 or dimension 1 sizes" in str(info.value)


def test_field_size_mismatch_names_the_field():
    with pytest.raises(UnsupportedDataFormatException) as info:
        DefaultBatchTransform(B).transform({"x": torch.zeros(B, 2), "y": ["a", "b", "c"]})
    assert "does not match dimension 0" in str(info.value) and "'y'" in str(info.value)


def _pairs(n):
    return [(torch.tensor([float(i), float(i)]), i) for i in range(n)]


@pytest.mark.parametrize(
    "make,right_index",
    [
        (lambda: default_collate(_pairs(2)), 1),  # 2 fields of 2 samples
        (lambda: list(_pairs(2)), 0),  # 2 samples of 2 fields
    ],
)
def test_both_dimensions_match_and_batch_format_index_resolves_it(make, right_index):
    batch = make()
    with pytest.raises(UnsupportedDataFormatException) as info:
        DefaultBatchTransform(2).transform(batch)
    assert "Both dimension 0 and dimension 1 match batch size" in str(info.value)
    assert "batch_format_index" in str(info.value)

    t = DefaultBatchTransform(2, right_index)
    out = t.reverse_transform(t.transform(batch).select([1]))
    if right_index == 1:
        assert_same(out, default_collate(_pairs(2)[1:]))
    else:
        assert_same(out, list(_pairs(2)[1:]))


@pytest.mark.parametrize("shape", [(B, B), (B, B, 3), (B + 1, B), (B - 1, B), (2, B)])
def test_a_bare_tensor_is_split_along_dimension_0(shape):
    """Square or not, and whatever its dimension 1 is: a DataLoader over a tensor dataset
    stacks samples along dimension 0 (lists and tuples are the ambiguous ones)."""
    batch = torch.arange(float(np.prod(shape))).view(shape)
    for t in (DefaultBatchTransform(B), DefaultBatchTransform(None)):
        sb = t.transform(batch)
        assert len(sb) == shape[0]
        assert_same(t.reverse_transform(sb.select([1, 0])), batch[[1, 0]])


def test_square_tensor_batches_through_the_loader():
    from torch.utils.data import DataLoader

    from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader

    class RowNorm:
        def loss(self, model, transformed_batch, original_batch=None):
            return original_batch.norm(dim=1)

    data = torch.randn(10 * 16 + 3, 16)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0, loss_history_length=32, loss_based_sift_config={"sift_config": {"sift_delay": 0}}, seed=0
        ),
        orig_dataloader=DataLoader(data, batch_size=16),
        loss_impl=RowNorm(),
        model=torch.nn.Linear(16, 1),
    )
    rows = torch.cat(list(loader))
    assert rows.shape[1] == 16 and rows.shape[0] % 16 == 0
    kept = {tuple(r.tolist()) for r in rows}
    assert len(kept) == rows.shape[0] and kept <= {tuple(r.tolist()) for r in data}  # whole rows, each once
    assert loader.counts.num_orig_samples_seen == data.shape[0]


def test_batch_format_index_one_on_a_tensor_selects_columns():
    batch = torch.arange(12).view(3, 4)  # 3 features of 4 samples
    t = DefaultBatchTransform(4, 1)
    sb = t.transform(batch)
    assert len(sb) == 4
    assert_same(t.reverse_transform(sb.select([3, 1])), batch[:, [3, 1]])
    with pytest.raises(UnsupportedDataFormatException, match="at least 2 dimensions"):
        DefaultBatchTransform(4, 1).transform(torch.arange(4))


@pytest.mark.parametrize("index", [2, -1, True, False, "0", "1", 1.0, 0.5, [0]])
def test_invalid_batch_format_index(index):
    with pytest.raises(UnsupportedDataFormatException, match="batch_format_index"):
        DefaultBatchTransform(B, index)


def test_numpy_int_batch_format_index():
    t = DefaultBatchTransform(2, np.int64(1))
    out = t.reverse_transform(t.transform(default_collate(_pairs(2))).select([0]))
    assert_same(out, default_collate(_pairs(1)))


# -- format decided once ------------------------------------------------------------------------


def test_short_last_batch_keeps_the_feature_major_format():
    # 3-field samples, batch size 4: the last batch of 3 samples is 3 x 3, ambiguous on its own.
    samples = [(torch.tensor([float(i)]), i, f"s{i}") for i in range(7)]
    full, short = default_collate(samples[:4]), default_collate(samples[4:])
    with pytest.raises(UnsupportedDataFormatException, match="Both dimension 0 and dimension 1"):
        DefaultBatchTransform(B).transform(short)
    t = DefaultBatchTransform(B)
    assert len(t.transform(full)) == 4
    sb = t.transform(short)
    assert len(sb) == 3
    out = t.reverse_transform(t.transform(full).select([1]).concat([sb.select([2, 0])]))
    assert_same(out, default_collate([samples[1], samples[6], samples[4]]))


def test_short_last_batch_keeps_the_sample_major_format():
    # Lists of 2-field samples, batch size 4: a last batch of 2 samples is 2 x 2.
    samples = _pairs(6)
    t = DefaultBatchTransform(B)
    assert len(t.transform(samples[:4])) == 4
    sb = t.transform(samples[4:])
    assert len(sb) == 2
    out = t.reverse_transform(sb.select([1]))
    assert_same(out, [samples[5]])


def test_short_last_tensor_batch():
    t = DefaultBatchTransform(B)
    assert len(t.transform(torch.zeros(4, 3))) == 4
    assert len(t.transform(torch.zeros(3, 3))) == 3
    assert len(t.transform(torch.zeros(1, 3))) == 1


def test_short_first_batch_when_the_dataset_is_smaller_than_a_batch():
    samples = tuple_samples(5)
    t = DefaultBatchTransform(8)
    out = t.reverse_transform(t.transform(default_collate(samples)).select([2]))
    assert_same(out, default_collate(samples[2:3]))


def test_short_last_batch_keeps_the_format_of_lists_inside_dicts():
    # {"pair": [tensor[n], tensor[n]]}: with a last batch of 2 samples the field is 2 x 2.
    samples = dict_samples(6)
    full, short = default_collate(samples[:4]), default_collate(samples[4:])
    t = DefaultBatchTransform(B)
    a = t.transform(full)
    b = t.transform(short)
    assert len(b) == 2
    out = t.reverse_transform(a.select([0]).concat([b.select([1, 0])]))
    assert_same(out, default_collate([samples[0], samples[5], samples[4]]))


# -- accumulation errors ----------------------------------------------------------------------


def test_accumulating_different_per_sample_shapes_names_the_field():
    t = DefaultBatchTransform(B)
    a = t.transform({"input_ids": torch.zeros(B, 10, dtype=torch.long), "labels": torch.zeros(B)})
    b = t.transform({"input_ids": torch.zeros(B, 12, dtype=torch.long), "labels": torch.zeros(B)})
    with pytest.raises(UnsupportedDataFormatException) as info:
        a.select([0]).concat([b.select([1])])
    msg = str(info.value)
    assert "input_ids" in msg and "(12,)" in msg and "(10,)" in msg


def test_accumulating_different_shapes_in_feature_major_lists_and_arrays():
    t = DefaultBatchTransform(B)
    a = t.transform([torch.zeros(B, 10), torch.zeros(B)])
    b = t.transform([torch.zeros(B, 11), torch.zeros(B)])
    with pytest.raises(UnsupportedDataFormatException, match=r"field \[0\]"):
        a.concat([b])
    t = DefaultBatchTransform(B)
    a = t.transform({"img": np.zeros((B, 2, 2))})
    b = t.transform({"img": np.zeros((B, 2, 3))})
    with pytest.raises(UnsupportedDataFormatException, match="img"):
        a.concat([b])


def test_accumulating_batches_with_different_fields():
    t = DefaultBatchTransform(B)
    a = t.transform({"a": torch.zeros(B)})
    b = t.transform({"b": torch.ones(B)})
    with pytest.raises(UnsupportedDataFormatException, match="different structure"):
        a.concat([b])
    c = t.transform({"a": torch.zeros(B), "b": torch.zeros(B)})
    with pytest.raises(UnsupportedDataFormatException, match="different structure"):
        a.concat([c])


def test_accumulating_a_field_that_changed_kind():
    t = DefaultBatchTransform(B)
    a = t.transform({"x": torch.zeros(B), "s": ["a"] * B})
    b = t.transform({"x": torch.zeros(B), "s": torch.zeros(B)})
    with pytest.raises(UnsupportedDataFormatException, match="'s'"):
        a.concat([b])


def test_transformed_batch_reads_like_the_users_batch():
    """A loss that iterates or indexes ``transformed_batch`` sees the user's own batch."""
    x, y = torch.arange(6.0).view(3, 2), torch.tensor([0, 1, 0])
    t = DefaultBatchTransform(3).transform([x, y])
    first, second = [v.clone() for v in t]
    assert torch.equal(first, x) and torch.equal(second, y)
    assert torch.equal(t[1], y)
    d = DefaultBatchTransform(3).transform({"x": x, "y": y})
    assert torch.equal(d["x"], x) and list(d) == ["x", "y"]


def test_fields_of_tensors_parse_like_the_general_parser():
    """The direct path for a list/tuple of tensor fields builds the general parser's tree."""
    from neuron_sift.data_model.structure import BatchStructure

    batch = default_collate(tuple_samples(B))
    fast = DefaultBatchTransform(B).transform((batch[0], batch[1]))
    general = DefaultBatchTransform(B).transform((batch[0], batch[1], list(batch[2])))  # a list field: general path
    assert fast.structure == BatchStructure.sequence(tuple, [BatchStructure.leaf(0), BatchStructure.leaf(1)])
    assert fast.structure.container is tuple and general.structure.container is tuple
    assert general.structure.children[:2] == fast.structure.children
    assert_same(DefaultBatchTransform(B).reverse_transform(fast), (batch[0], batch[1]))


def test_joining_batches_of_tensor_fields_checks_the_field_count_and_shapes():
    t = DefaultBatchTransform(B)
    two = t.transform((torch.zeros(B, 3), torch.zeros(B)))
    three = t.transform((torch.zeros(B, 3), torch.zeros(B), torch.zeros(B)))
    with pytest.raises(UnsupportedDataFormatException, match="different structure"):
        two.concat([three])
    wider = t.transform((torch.zeros(B, 4), torch.zeros(B)))
    with pytest.raises(UnsupportedDataFormatException, match=r"field \[0\]: per-sample shape \(4,\)"):
        two.concat([wider])
    joined = two.concat([t.transform((torch.ones(B, 3), torch.ones(B)))])
    assert len(joined) == 2 * B and joined.structure is two.structure


@pytest.mark.parametrize(
    "make",
    [
        lambda: default_collate(tuple_samples(B)),
        lambda: default_collate(dict_samples(B)),
        lambda: np.arange(B * 2).reshape(B, 2),
        lambda: list(tuple_samples(B)),
    ],
)
def test_split_at_equals_selecting_the_two_ranges(make):
    batch = make()
    t = DefaultBatchTransform(B)
    parsed = t.transform(batch)
    first, rest = parsed.split_at(3)
    assert (len(first), len(rest)) == (3, B - 3)
    assert_same(t.reverse_transform(first), t.reverse_transform(parsed.select(range(3))))
    assert_same(t.reverse_transform(rest), t.reverse_transform(parsed.select(list(range(3, B)))))


def test_tensor_and_list_indices_select_the_same_rows():
    batch = default_collate(dict_samples(B))
    t = DefaultBatchTransform(B)
    parsed = t.transform(batch)
    by_tensor = t.reverse_transform(parsed.select(torch.tensor([3, 1, 2])))
    by_list = t.reverse_transform(parsed.select([3, 1, 2]))
    assert_same(by_tensor, by_list)
