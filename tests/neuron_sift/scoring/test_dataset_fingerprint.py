"""``dataset_fingerprint``: what ties a reference table to its dataset. It reads a few samples
at evenly spaced ids (the first and the last among them) whatever the dataset's size, tells
values, types, dtypes and shapes apart, and is a documented digest: it is kept in tables on disk."""

import hashlib
import struct

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from neuron_sift import dataset_fingerprint
from neuron_sift.scoring.reference_table import fingerprint_ids


class Edited(torch.utils.data.Dataset):
    def __init__(self, n, edit=None):
        self.n, self.edit = n, edit

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((2,), float(i) + (i == self.edit)), "label": i % 3}


def test_the_fingerprint_changes_with_a_sampled_sample_only():
    n = 100
    sampled = fingerprint_ids(n)
    assert len(sampled) == 16 and sampled[0] == 0 and sampled[-1] == n - 1
    unsampled = next(i for i in range(n) if i not in sampled)
    base = dataset_fingerprint(Edited(n))
    assert dataset_fingerprint(Edited(n, edit=sampled[7])) != base
    assert dataset_fingerprint(Edited(n, edit=n - 1)) != base
    assert dataset_fingerprint(Edited(n, edit=unsampled)) == base
    assert dataset_fingerprint(Edited(n + 1)) != base


def test_the_fingerprint_tells_types_and_shapes_apart():
    def fp(*samples):
        return dataset_fingerprint(list(samples))

    assert len({fp(1), fp(1.0), fp(True), fp("1"), fp(b"1"), fp(None), fp(np.int64(1))}) == 7
    assert fp(torch.zeros(2, 3)) != fp(torch.zeros(3, 2))  # the same bytes, other shapes
    assert fp(torch.zeros(4, dtype=torch.int32)) != fp(torch.zeros(4))  # the same bytes, other dtypes
    assert fp(np.zeros(4, np.float32)) != fp(np.zeros(4, np.float64)) != fp(torch.zeros(4))
    assert fp((1, 2)) != fp([1, 2]) != fp((1, (2,)))
    assert fp({"a": 1, "b": 2}) == fp({"b": 2, "a": 1}) != fp({"a": 2, "b": 1})
    assert fp(np.array(["a", 1], dtype=object)) != fp(np.array(["a", 2], dtype=object))

    def objects():  # equal values in new objects: an object array counts by its items, not their addresses
        return np.array([int("7" * 30), "".join(["ab"] * 30)], dtype=object)

    assert fp(objects()) == fp(objects())
    assert fp(torch.arange(4)[::2]) == fp(torch.tensor([0, 2]))  # a view counts by its values


def test_the_fingerprint_is_the_documented_digest():
    """The digest is kept in tables on disk: its bytes are the format (length, then each
    sampled id and its sample, every part framed as tag, length, payload)."""

    def part(tag, payload):
        return tag + struct.pack("<Q", len(payload)) + payload

    x = torch.tensor([1.5, -2.0])
    expected = hashlib.sha256(
        part(b"len", struct.pack("<Q", 1))
        + part(b"id", struct.pack("<Q", 0))
        + part(b"tuple", struct.pack("<Q", 3))
        + part(b"tensor", b"torch.float32(2,)")
        + part(b"data", x.numpy().tobytes())
        + part(b"int", b"3")
        + part(b"float", (0.25).hex().encode())
    ).hexdigest()
    assert dataset_fingerprint([(x, 3, 0.25)]) == expected


def test_the_fingerprint_counts_other_objects_by_their_type_only():
    class Image:
        def __init__(self, pixels):
            self.pixels = pixels

    assert dataset_fingerprint([Image(1)]) == dataset_fingerprint([Image(2)])
    assert dataset_fingerprint([Image(1)]) != dataset_fingerprint([object()])


def test_the_fingerprint_needs_a_map_style_dataset():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="needs a map-style dataset .*got Stream"):
        dataset_fingerprint(Stream())
    with pytest.raises(TypeError, match="needs a map-style dataset .*got generator"):
        dataset_fingerprint(i for i in range(3))
    assert dataset_fingerprint(TensorDataset(torch.zeros(3))) != dataset_fingerprint(TensorDataset(torch.ones(3)))


class Augmented(torch.utils.data.Dataset):
    """Each read adds noise from torch's, NumPy's and Python's global generators."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        import random

        return torch.full((3,), float(i)) + torch.randn(3) + float(np.random.rand()) + random.random()


def _seed(value):
    import random

    torch.manual_seed(value)
    np.random.seed(value)
    random.seed(value)


def _draws():
    import random

    return torch.rand(2).tolist(), float(np.random.rand()), random.random()


def test_random_augmentation_does_not_change_the_fingerprint_nor_the_users_draws():
    data = Augmented()
    _seed(7)
    first = dataset_fingerprint(data)
    after_fingerprint = _draws()
    _seed(7)
    assert _draws() == after_fingerprint  # the fingerprint's reads drew nothing of the user's
    _seed(8)
    assert dataset_fingerprint(data) == first  # whatever state the generators are in
