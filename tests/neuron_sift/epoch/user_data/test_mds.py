"""MosaicML Streaming, the package itself: MDS shards written with ``streaming.MDSWriter``
into a local folder and read with ``StreamingDataset(local=..., remote=None)`` through
``EpochSiftingDataloader``, on one process and on 2 gloo ranks. What users rely on: a
sifted epoch reads every planned sample once and no other, also after a mid-epoch resume;
a shard none of whose samples an epoch needs is never opened (no sample read out of it,
never decompressed); and a setting of Streaming's own iteration that the plans would
ignore is refused, saying what to set instead.

Reads are counted in Streaming's shard reader (``ShardReads``: one file open per sample
read), decompressions by the raw ``.mds`` files that appear next to the compressed ones.

Marker ``streaming``: run where a leg installs a Streaming package (``mosaicml-streaming``
or its maintained fork ``streaming-community``, the same ``streaming`` import); the other
legs deselect it, and NEURON_SIFT_REQUIRE_STREAMING=1 makes a missing package fail the run
(tests/conftest.py).
"""

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

try:  # without a Streaming package these tests are deselected by marker, skipped by tests/conftest.py
    from streaming import Stream, StreamingDataset
except ImportError:
    Stream = StreamingDataset = None

from neuron_sift import EpochSiftingDataloader  # noqa: E402
from tests.helpers.state_roundtrip import roundtrip  # noqa: E402
from tests.neuron_sift import torchrun  # noqa: E402
from tests.neuron_sift.epoch.format_sources import WIDTH, ShardReads, raw_shards, shards_of, write_mds  # noqa: E402
from tests.neuron_sift.epoch.helpers import (
    PRUNE_FROM_THE_START,  # noqa: E402
    worker,  # noqa: E402
)
from tests.neuron_sift.integrations.readme_examples import example  # noqa: E402

pytestmark = [
    pytest.mark.streaming,
    # MDS decodes an ndarray column as a read-only view of the shard's bytes; torch's collate says so once.
    pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning"),
]

N, BATCH = 96, 8
CONFIG = {**PRUNE_FROM_THE_START, "seed": 5, "kept_share": 0.5, "warmup_epochs": 1}
WORKER = worker("mds_worker.py")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """N samples in compressed MDS shards of two samples, never opened: tests copy it."""
    return write_mds(str(tmp_path_factory.mktemp("mds") / "written"), N)


@pytest.fixture
def local(pristine, tmp_path):
    """A fresh copy of the shards for one dataset (Streaming decompresses into its folder)."""
    return shutil.copytree(pristine, str(tmp_path / "local"))


@pytest.fixture
def reads(tmp_path):
    counter = ShardReads(str(tmp_path / "reads.log")).install()
    yield counter
    counter.uninstall()


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.2)


def train(loader, model, opt, batches=None):
    """The epoch's batches (``batches`` of them, or the rest); the ids trained, in order."""
    trained = []
    for batch in loader:
        trained += batch["id"].tolist()
        per_sample = F.cross_entropy(model(batch["x"]), batch["y"], reduction="none")
        loss = loader.weighted_loss(per_sample)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if batches is not None and len(trained) == batches * BATCH:
            break
    return trained


# -- one process -------------------------------------------------------------------------


@pytest.mark.parametrize(("shuffle", "workers"), [(True, 0), (False, 0), (True, 2)])
def test_each_epoch_reads_its_planned_samples_once_and_opens_no_other_shard(local, reads, shuffle, workers):
    ds = StreamingDataset(local=local, remote=None, batch_size=BATCH, shuffle=shuffle)
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH, num_workers=workers), num_epochs=4)
    assert loader.n == ds.size == N
    model, opt = model_and_optimizer()
    every_shard = shards_of(ds, range(N))
    kinds = []
    for _ in range(3):
        reads.clear()
        plan = loader.start_epoch()
        trained = train(loader, model, opt)
        order = plan.order.tolist()
        read = reads.ids(ds)
        assert trained == order  # the planned samples, in the planned order
        assert len(read) == len(set(read)) and sorted(read) == sorted(order)  # each once, no other
        assert reads.shards() == shards_of(ds, order)  # a shard is opened only for a planned sample
        if not shuffle:
            assert trained == sorted(trained)  # shuffle=False: dataset order
        kinds.append((plan.kind, len(read), len(reads.shards()) < len(every_shard)))
    # the warm-up reads every sample; each sifted epoch half of them, and leaves whole shards unopened
    assert kinds == [("warmup", N, False), ("sift", N // 2, True), ("sift", N // 2, True)]
    assert raw_shards(local) == every_shard  # the warm-up decompressed every shard


@pytest.mark.parametrize("cut", [0, 3])
def test_a_resumed_sifted_epoch_reads_and_decompresses_only_the_rest_of_its_plan(pristine, tmp_path, reads, cut):
    """Preempted ``cut`` batches into a sifted epoch; a new dataset over a fresh copy of the
    compressed shards (a restarted job on a new machine) resumes the loader's state. With
    ``cut=0`` that is a whole sifted epoch in a process that never read a sample before."""
    first_local = shutil.copytree(pristine, str(tmp_path / "first"))
    ds = StreamingDataset(local=first_local, remote=None, batch_size=BATCH, shuffle=True)
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=4)
    model, opt = model_and_optimizer()
    assert train(loader, model, opt) == loader.plan.order.tolist()  # the warm-up
    plan = loader.start_epoch()
    assert plan.kind == "sift"
    first = train(loader, model, opt, batches=cut) if cut else []
    state = roundtrip(loader.state_dict())

    again_local = shutil.copytree(pristine, str(tmp_path / "again"))
    again = StreamingDataset(local=again_local, remote=None, batch_size=BATCH, shuffle=True)
    resumed = EpochSiftingDataloader(CONFIG, DataLoader(again, batch_size=BATCH), num_epochs=4)
    resumed.load_state_dict(state)
    reads.clear()
    rest = train(resumed, model, opt)
    assert len(first) == cut * BATCH and first + rest == plan.order.tolist()  # nothing twice, nothing lost
    read = reads.ids(again)
    assert len(read) == len(set(read)) and sorted(read) == sorted(rest)  # only the rest, each once
    needed = shards_of(again, rest)
    assert reads.shards() == needed
    assert raw_shards(again_local) == needed  # decompressed: exactly the shards the rest reads from
    assert len(needed) < len(shards_of(again, range(N)))  # and some shard was never opened


# -- Streaming's own iteration settings --------------------------------------------------

REFUSED = {
    "shuffle_seed": (dict(shuffle=True, shuffle_seed=17), ["shuffle_seed=17", "EpochSiftConfig(seed=...)"]),
    "shuffle_algo": (dict(shuffle=True, shuffle_algo="py1s"), ["shuffle_algo='py1s'", "default ('py1e')"]),
    "shuffle_block_size": (dict(shuffle=True, shuffle_block_size=16), ["shuffle_block_size=16", "default (None)"]),
    "num_canonical_nodes": (dict(num_canonical_nodes=2), ["num_canonical_nodes=2", "deals it out to the ranks"]),
    "partition_algo": (dict(partition_algo="orig"), ["partition_algo='orig'", "default ('relaxed')"]),
    "batching_method": (dict(batching_method="stratified"), ["batching_method='stratified'", "default ('random')"]),
    "epoch_size": (dict(epoch_size=2 * N), ["stream 0: 192 of its 96", "leave epoch_size unset"]),
    "repeat": ("repeat", ["stream 0: 192 of its 96", "no proportion, repeat or choose"]),
    "choose": ("choose", ["stream 0: 50 of its 96", "no proportion, repeat or choose"]),
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_setting_of_streamings_own_iteration_is_refused_saying_what_to_set(local, reads, name):
    kwargs, fragments = REFUSED[name]
    if kwargs == "repeat":
        ds = StreamingDataset(streams=[Stream(local=local, repeat=2)], batch_size=BATCH)
    elif kwargs == "choose":
        ds = StreamingDataset(streams=[Stream(local=local, choose=50)], batch_size=BATCH)
    else:
        ds = StreamingDataset(local=local, remote=None, batch_size=BATCH, **kwargs)
    with pytest.raises(ValueError, match="never iterates it, so these settings of its iteration") as err:
        EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=2)
    for fragment in fragments:
        assert fragment in str(err.value)
    assert reads.entries() == []  # refused before any read


def test_every_refusal_is_named_in_one_message(local):
    ds = StreamingDataset(local=local, remote=None, batch_size=BATCH, shuffle=True, shuffle_seed=3, epoch_size=48)
    with pytest.raises(ValueError) as err:
        EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=2)
    assert "shuffle_seed=3" in str(err.value) and "stream 0: 48 of its 96" in str(err.value)


def test_settings_that_change_nothing_here_are_accepted(local, reads):
    """The shuffle's settings without shuffle=True, replication=1, and the values Streaming's
    own iteration filled in (num_canonical_nodes, shuffle_block_size) once it has run."""
    ds = StreamingDataset(
        local=local, remote=None, batch_size=BATCH, shuffle_seed=17, shuffle_algo="py1s", replication=1
    )
    loader = EpochSiftingDataloader(CONFIG, DataLoader(ds, batch_size=BATCH), num_epochs=2)
    model, opt = model_and_optimizer()
    assert train(loader, model, opt) == list(range(N))  # shuffle=False: dataset order
    iterated = StreamingDataset(local=shutil.copytree(local, local + "2"), remote=None, batch_size=BATCH, shuffle=True)
    assert iterated.num_canonical_nodes is None
    assert sorted(int(s["id"]) for s in iterated) == list(range(N))  # its own iteration, every sample
    assert iterated.num_canonical_nodes is not None  # now Streaming's own value
    EpochSiftingDataloader(CONFIG, DataLoader(iterated, batch_size=BATCH), num_epochs=2)


# -- the documentation's example -----------------------------------------------------------


def test_the_docs_mds_example_trains_the_kept_samples_reading_no_other(tmp_path, monkeypatch, reads, one_thread):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    exec(compile(example("MosaicML Streaming (MDS shards)"), "docs/data-formats.md", "exec"), namespace)
    loader, train_ds = namespace["loader"], namespace["train_ds"]
    # the default start rule holds the first epoch with scores (nothing to compare them with yet)
    assert [h["kind"] for h in loader.history] == ["warmup", "held", "sift", "sift"]
    trained = [h["kept"] for h in loader.history]
    assert trained == [512, 512, 256, 256]
    read = reads.ids(train_ds)
    assert len(read) == sum(trained) and set(read) == set(range(512))  # the kept samples, read in workers


# -- two gloo ranks ----------------------------------------------------------------------


@pytest.mark.slow
def test_two_ranks_read_their_own_planned_samples_once_also_after_a_resume(pristine, tmp_path):
    """Each rank reads exactly its share of every epoch's plan (Streaming's own per-rank
    ``len()`` is half the samples; the plans cover all of them), a replicated dataset is
    refused on every rank, and a job restarted on fresh copies of the shards mid sifted
    epoch reads and decompresses only the rest of the ranks' shares."""
    shared = shutil.copytree(pristine, str(tmp_path / "shared"))
    replicated = shutil.copytree(pristine, str(tmp_path / "replicated"))
    out = torchrun.launch(WORKER, tmp_path, 2, "--shards", shared, "--replicated", replicated, tag="run")
    runs = torchrun.results(out, 2)
    for r in runs:
        assert (r["len"], r["size"]) == (N // 2, N)
        assert "replication=2" in r["refused"] and "each rank its own share" in r["refused"]
    for e, kind in enumerate(["warmup", "sift"]):
        plan = runs[0]["plans"][e]
        assert all(r["plans"][e] == plan and r["kinds"][e] == kind for r in runs)
        mine = [r["mine"][e] for r in runs]
        assert sorted(mine[0] + mine[1]) == sorted(plan)  # the ranks' shares: the whole plan, disjoint
        for r in runs:
            assert r["trained"][e] == r["mine"][e]  # in the planned order
            assert len(r["reads"][e]) == len(set(r["reads"][e])) and sorted(r["reads"][e]) == sorted(r["mine"][e])
    assert len(runs[0]["plans"][1]) == N // 2

    fresh = shutil.copytree(pristine, str(tmp_path / "fresh"))
    resumed = torchrun.results(torchrun.launch(WORKER, tmp_path, 2, "--shards", fresh, "--resume", tag="run"), 2, True)
    needed = set()
    for r, again in zip(runs, resumed):
        assert r["first"] + again["rest"] == r["mine"][1]  # nothing twice, nothing lost
        assert len(again["reads"]) == len(set(again["reads"])) and sorted(again["reads"]) == sorted(again["rest"])
        needed |= set(again["shards"])
    assert set(resumed[0]["decompressed"]) == needed  # on the node: only the shards the rest reads from
    assert len(needed) < resumed[0]["all_shards"]
