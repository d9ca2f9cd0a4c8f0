"""The reference-loss table: its folder layout (the contract the loaders read), the round trip,
lookups by sample id, the dataset it belongs to (size and fingerprint), and every refusal,
each naming the values and what to do."""

import json

import numpy as np
import pytest
import torch

from neuron_sift import ReferenceTable, dataset_fingerprint
from neuron_sift.scoring import reference_files as files
from tests.neuron_sift.scoring.reference_helpers import IdData

NAN = float("nan")


def table(n=10, fingerprint=None):
    losses = torch.arange(n, dtype=torch.float32) / 4
    losses[3] = NAN
    return ReferenceTable.from_losses(losses, fingerprint=fingerprint, description="toy")


def write_contract(folder, n, shards, done=None, manifest=None, shard_changes=None):
    """A table written straight from the documented layout (not through the package's writer):
    shard ``r`` slot ``j`` holds id ``r + j * shards``, with loss ``id + 0.5``."""
    folder.mkdir(parents=True, exist_ok=True)
    head = {"format": files.FORMAT, "version": 1, "n": n, "shards": shards, "fingerprint": None}
    head |= {"description": "by hand", "ids_sha256": None, "covered": n}
    (folder / "manifest.json").write_text(json.dumps({**head, **(manifest or {})}))
    for r in range(shards):
        ids = torch.arange(r, n, shards)
        shard = {"format": files.FORMAT, "version": 1, "n": n, "shards": shards, "rank": r}
        shard |= {"losses": ids.float() + 0.5, "done": len(ids) if done is None else done[r]}
        torch.save({**shard, **(shard_changes or {}).get(r, {})}, folder / f"shard-{r:05d}-of-{shards:05d}.pt")
    return folder


# -- the layout and the round trip --------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    t = table(fingerprint="abc")
    t.save(tmp_path / "t")
    back = ReferenceTable.load(tmp_path / "t")
    assert (back.n, back.covered, back.fingerprint, back.description, back.path) == (
        10,
        9,
        "abc",
        "toy",
        tmp_path / "t",
    )
    np.testing.assert_array_equal(back.losses().numpy(), t.losses().numpy())
    assert torch.equal(back.lookup([9, 0, 4, 4]), torch.tensor([9, 0, 4, 4]) / 4)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["manifest.json", "shard-00000-of-00001.pt"]


def test_save_writes_the_documented_layout(tmp_path):
    table(fingerprint="abc").save(tmp_path / "t")
    head = json.loads((tmp_path / "t" / "manifest.json").read_text())
    covered_ids = np.array([i for i in range(10) if i != 3], dtype="<i8")
    assert head == {
        "format": "neuron_sift.reference_losses",
        "version": 1,
        "n": 10,
        "shards": 1,
        "fingerprint": "abc",
        "description": "toy",
        "ids_sha256": __import__("hashlib").sha256(covered_ids.tobytes()).hexdigest(),
        "covered": 9,
    }
    shard = torch.load(tmp_path / "t" / "shard-00000-of-00001.pt", weights_only=True)
    assert {k: v for k, v in shard.items() if k != "losses"} == {
        "format": "neuron_sift.reference_losses",
        "version": 1,
        "n": 10,
        "shards": 1,
        "rank": 0,
        "done": 9,
    }
    assert shard["losses"].dtype == torch.float32 and shard["losses"].shape == (10,)


def test_a_table_with_every_id_has_no_ids_digest(tmp_path):
    ReferenceTable.from_losses(np.ones(4)).save(tmp_path / "t")
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["ids_sha256"] is None


def test_shards_map_each_id_to_its_shard_and_slot(tmp_path):
    """Shard ``id % W``, slot ``id // W``: read from files written by hand after the contract."""
    t = ReferenceTable.load(write_contract(tmp_path / "t", 11, 3))
    ids = [10, 0, 5, 7, 1, 8]
    assert torch.equal(t.lookup(ids), torch.tensor(ids, dtype=torch.float32) + 0.5)
    assert torch.equal(t.losses(), torch.arange(11, dtype=torch.float32) + 0.5)
    assert (t.n, t.covered, t.description) == (11, 11, "by hand")


def test_load_maps_the_shards_instead_of_reading_them(tmp_path, monkeypatch):
    """Every shard memory-mapped and read as tensors only (``weights_only``: no code runs from the file)."""
    calls = []
    load = torch.load

    def spy(*args, **kwargs):
        calls.append({k: kwargs.get(k) for k in ("weights_only", "mmap")})
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    ReferenceTable.load(write_contract(tmp_path / "t", 11, 3))
    assert calls == [{"weights_only": True, "mmap": True}] * 3


def test_save_refuses_a_folder_that_holds_files(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"cannot save a reference table to .*t: it exists and is not an empty folder"):
        table().save(tmp_path / "t")


def test_save_leaves_no_temporary_file(tmp_path):
    table().save(tmp_path / "t")
    assert not [p for p in (tmp_path / "t").iterdir() if p.name.startswith(".")]


def test_a_write_cut_short_leaves_the_previous_file(tmp_path, monkeypatch):
    """A preempted save: the shard on disk is still the last complete one, and no half file stays."""
    table().save(tmp_path / "t")

    def cut_short(obj, f):
        f.write(b"half a shard")
        raise OSError("no space left on device")

    monkeypatch.setattr(torch, "save", cut_short)
    with pytest.raises(OSError, match="no space left"):
        files.write_shard(tmp_path / "t", 10, 1, 0, torch.zeros(10), 10)
    monkeypatch.undo()
    np.testing.assert_array_equal(ReferenceTable.load(tmp_path / "t").losses().numpy(), table().losses().numpy())
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["manifest.json", "shard-00000-of-00001.pt"]


# -- from_losses ---------------------------------------------------------------------------


def test_from_losses_counts_nan_as_not_covered():
    t = table()
    assert (t.n, t.covered, t.path) == (10, 9, None)
    assert t.losses().dtype == torch.float32


def test_from_losses_refuses_inf():
    losses = torch.zeros(5)
    losses[2] = float("inf")
    with pytest.raises(ValueError, match=r"losses\[2\] is inf .*finite"):
        ReferenceTable.from_losses(losses)


def test_from_losses_refuses_a_value_float32_cannot_hold():
    with pytest.raises(ValueError, match=r"losses\[1\] is inf \(as float32\)"):
        ReferenceTable.from_losses(np.array([1.0, 1e300]))


def test_from_losses_refuses_two_dimensions():
    with pytest.raises(ValueError, match=r"must be 1-D .*got shape \[2, 3\]"):
        ReferenceTable.from_losses(torch.zeros(2, 3))


def test_from_losses_refuses_integers_and_other_types():
    with pytest.raises(TypeError, match="floating point .*got dtype torch.int64"):
        ReferenceTable.from_losses(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="got list"):
        ReferenceTable.from_losses([1.0, 2.0])


# -- lookup ----------------------------------------------------------------------------------


def test_lookup_takes_tensors_arrays_and_sequences_in_their_order():
    t = table()
    expected = torch.tensor([2.0, 1.25, 0.0])
    for ids in ([8, 5, 0], np.array([8, 5, 0], dtype=np.int32), torch.tensor([8, 5, 0])):
        out = t.lookup(ids)
        assert out.dtype == torch.float32 and out.device == torch.device("cpu")
        assert torch.equal(out, expected)
    assert t.lookup([]).shape == (0,)


def test_lookup_names_an_id_outside_the_table_and_where_it_is(tmp_path):
    with pytest.raises(
        ValueError, match=r"sample id 10 is outside \[0, 10\) of the reference table \(in-memory table\)"
    ):
        table().lookup([1, 10, -1])
    table().save(tmp_path / "t")
    with pytest.raises(ValueError, match=rf"sample id -1 is outside \[0, 10\) .*\({tmp_path / 't'}\)"):
        ReferenceTable.load(tmp_path / "t").lookup([1, -1])


def test_lookup_names_an_id_not_covered():
    with pytest.raises(ValueError, match=r"sample id 3 has no loss in the reference table \(in-memory table, 9 of 10"):
        table().lookup([0, 3, 4])


def test_lookup_names_an_uncovered_id_of_a_sharded_table(tmp_path):
    head = {"covered": 7, "ids_sha256": "digest of the scored ids"}
    slots = {0: {"losses": torch.tensor([0.5, 2.5, 4.5, NAN])}}  # id 6 (shard 0, slot 3) not scored
    folder = write_contract(tmp_path / "t", 8, 2, done=[3, 4], manifest=head, shard_changes=slots)
    assert torch.equal(ReferenceTable.load(folder).lookup([7, 4]), torch.tensor([7.5, 4.5]))
    with pytest.raises(ValueError, match="sample id 6 has no loss"):
        ReferenceTable.load(folder).lookup([7, 6])


def test_lookup_refuses_ids_that_are_not_integers_or_not_one_dimensional():
    with pytest.raises(TypeError, match="integer sample ids, got dtype float"):
        table().lookup(torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"must be 1-D .*got shape \[1, 2\]"):
        table().lookup([[1, 2]])


# -- the dataset it belongs to -----------------------------------------------------------------


def test_check_dataset_names_both_sizes():
    t = table()
    t.check_dataset(IdData(10))
    with pytest.raises(
        ValueError,
        match=r"the sampler: the reference table \(in-memory table\) has losses for 10 samples, but the dataset has 12",
    ):
        t.check_dataset(IdData(12), who="the sampler")


def test_check_dataset_names_both_fingerprints():
    t = table(fingerprint=dataset_fingerprint(IdData(10)))
    t.check_dataset(IdData(10))
    other = dataset_fingerprint(IdData(10, seed=1))
    with pytest.raises(ValueError, match=rf"a reference table from another dataset: .*{t.fingerprint}.*{other}"):
        t.check_dataset(IdData(10, seed=1))


def test_a_table_without_fingerprint_checks_the_size_only():
    table().check_dataset(IdData(10, seed=1))


# -- what load refuses: one ValueError each, naming the folder and what to do --------------------


def test_load_refuses_a_missing_folder(tmp_path):
    with pytest.raises(
        ValueError, match=rf"at {tmp_path / 'none'}: no such folder; write it with neuron_sift.score_dataset"
    ):
        ReferenceTable.load(tmp_path / "none")


def test_load_refuses_a_folder_without_manifest(tmp_path):
    with pytest.raises(ValueError, match=rf"at {tmp_path}: it has no manifest.json, so it is not a reference table"):
        ReferenceTable.load(tmp_path)


def test_load_refuses_another_format(tmp_path):
    write_contract(tmp_path, 4, 1, manifest={"format": "other.thing"})
    with pytest.raises(ValueError, match=r"manifest.json has format 'other.thing', not 'neuron_sift.reference_losses'"):
        ReferenceTable.load(tmp_path)


def test_load_refuses_another_version(tmp_path):
    write_contract(tmp_path, 4, 1, manifest={"version": 2})
    with pytest.raises(
        ValueError, match=r"version 2 of the layout, this neuron_sift reads version 1; use the neuron_sift"
    ):
        ReferenceTable.load(tmp_path)


def test_load_refuses_a_damaged_manifest(tmp_path):
    write_contract(tmp_path, 4, 1, manifest={"covered": 9})
    with pytest.raises(ValueError, match=r"manifest.json is damaged \(field covered"):
        ReferenceTable.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"manifest.json is damaged \(Expecting"):
        ReferenceTable.load(tmp_path)


def test_load_refuses_a_missing_shard(tmp_path):
    write_contract(tmp_path, 7, 2)
    (tmp_path / "shard-00001-of-00002.pt").unlink()
    with pytest.raises(
        ValueError, match=r"shard shard-00001-of-00002.pt is missing; rerun score_dataset .*2\) to write"
    ):
        ReferenceTable.load(tmp_path)


def test_load_refuses_a_damaged_shard(tmp_path):
    write_contract(tmp_path, 7, 2)
    (tmp_path / "shard-00000-of-00002.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"shard shard-00000-of-00002.pt cannot be read .*remove it and rerun"):
        ReferenceTable.load(tmp_path)


def test_load_refuses_a_shard_whose_header_disagrees(tmp_path):
    write_contract(tmp_path, 7, 2, shard_changes={1: {"n": 8}})
    with pytest.raises(
        ValueError, match=r"shard-00001-of-00002.pt's header .*'n': 8.* disagrees with the manifest .*'n': 7"
    ):
        ReferenceTable.load(tmp_path)


def test_load_refuses_a_shard_of_the_wrong_length(tmp_path):
    write_contract(tmp_path, 7, 2, shard_changes={0: {"losses": torch.zeros(3)}})
    with pytest.raises(
        ValueError, match=r"shard-00000-of-00002.pt holds torch.float32 \[3\] losses, not float32 \[4\]"
    ):
        ReferenceTable.load(tmp_path)


def test_load_refuses_an_incomplete_table(tmp_path):
    write_contract(tmp_path, 7, 2, done=[4, 1])
    with pytest.raises(
        ValueError, match=r"incomplete, 5 of 7 samples scored; rerun score_dataset with the same arguments to finish it"
    ):
        ReferenceTable.load(tmp_path)
