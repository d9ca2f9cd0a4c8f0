"""Both sifting loaders checkpointed with torch.distributed.checkpoint (DCP) on one process,
beside the model and optimizer, as docs/checkpoints.md shows: a checkpoint in the middle of
a sifted epoch, loaded into a freshly built run, continues with the uninterrupted run's
batches and ends with its weights, bit for bit; an ``async_save`` in flight while training
goes on holds the state of the step it was taken at; wrong uses get errors that say what to
do. Then under torchrun (``dcp_worker.py``, 2 gloo ranks): each rank resumes exactly at the
same world size; at 3 ranks the epoch loader reshards and the per-batch loader refuses.
"""

import io
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.utils.data import DataLoader, Subset

from neuron_sift import EpochSiftingDataloader, Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations import PerRankLoaderState, ReshardingLoadPlanner
from neuron_sift.integrations.distributed_checkpoint import RankStates
from neuron_sift.integrations.schedules import ExactLengthLoader
from tests.neuron_sift import torchrun
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld
from tests.neuron_sift.integrations import dcp_runs

# Steps after which the run is checkpointed: in the sifted epoch of the epoch loader (12 warm-up
# steps, 6 sifted, 12 annealing) and in the middle of the per-batch loader's second epoch (7
# steps, then 5 and 6: sifting after a delay of 2 source batches).
STOP = {"epoch": 15, "per-batch": 9}
KINDS = ["epoch", "per-batch"]
# DCP on one process says it assumes one process: so it does here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def uninterrupted(kind: str) -> tuple[list, torch.Tensor]:
    run = dcp_runs.build(kind)
    return list(dcp_runs.training(run)), run.params


def resumed(kind: str, checkpoint_id: str, planner=None) -> tuple[list, torch.Tensor]:
    """A fresh run loaded from the checkpoint, trained to its end."""
    run = dcp_runs.build(kind)
    dcp_runs.restore(run, checkpoint_id, planner)
    return list(dcp_runs.training(run)), run.params


def trained_until(kind: str, stop: int):
    """A run and its loop, stopped after ``stop`` steps."""
    run = dcp_runs.build(kind)
    loop = dcp_runs.training(run)
    steps = [next(loop) for _ in range(stop)]
    return run, loop, steps


@pytest.mark.parametrize("planner", [None, ReshardingLoadPlanner()], ids=["default-planner", "resharding-planner"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_mid_epoch_checkpoint_resumes_exactly(tmp_path, kind, planner):
    full, final = uninterrupted(kind)
    run, _loop, before = trained_until(kind, STOP[kind])
    assert before == full[: STOP[kind]]
    if kind == "epoch":
        assert run.loader.plan.kind == "sift" and run.loader.resuming is False
    dcp.save(dcp_runs.checkpoint_state(run), checkpoint_id=str(tmp_path))
    rest, params = resumed(kind, str(tmp_path), planner)
    assert rest == full[STOP[kind] :]  # the same samples, in the same order, in the same epochs
    assert torch.equal(params, final)


@pytest.mark.parametrize("kind", KINDS)
def test_async_save_holds_the_state_of_its_step(tmp_path, kind):
    """Training goes on (several steps, the loader's state and the weights changing) while the
    save is in flight; the checkpoint is still the step's at which it was taken."""
    full, final = uninterrupted(kind)
    run, loop, _ = trained_until(kind, STOP[kind])
    at_save = run.params.clone()
    future = dcp.async_save(dcp_runs.checkpoint_state(run), checkpoint_id=str(tmp_path))
    after = [next(loop) for _ in range(3)]
    assert after == full[STOP[kind] : STOP[kind] + 3]
    future.result()
    assert not torch.equal(run.params, at_save)  # the run went on
    fresh = dcp_runs.build(kind)
    dcp_runs.restore(fresh, str(tmp_path))
    assert torch.equal(fresh.params, at_save)
    assert list(dcp_runs.training(fresh)) == full[STOP[kind] :]
    assert torch.equal(fresh.params, final)


def test_an_end_of_run_checkpoint_trains_nothing_more(tmp_path):
    full, final = uninterrupted("epoch")
    run = dcp_runs.build("epoch")
    assert list(dcp_runs.training(run)) == full
    dcp.save(dcp_runs.checkpoint_state(run), checkpoint_id=str(tmp_path))
    rest, params = resumed("epoch", str(tmp_path))
    assert rest == [] and torch.equal(params, final)


@pytest.mark.parametrize("thing", [object(), torch.utils.data.DataLoader(range(4)), {"state": 1}])
def test_wrapping_what_is_no_sifting_loader_is_refused(thing):
    with pytest.raises(TypeError, match="PerRankLoaderState wraps a SiftingDataloader or EpochSiftingDataloader"):
        PerRankLoaderState(thing)


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_without_the_loader_is_refused_by_name(tmp_path, kind):
    run, _loop, _ = trained_until(kind, 3)
    state = dcp_runs.checkpoint_state(run)
    del state["loader"]
    dcp.save(state, checkpoint_id=str(tmp_path))
    fresh = dcp_runs.build(kind)
    with pytest.raises(CheckpointException, match="ValueError: the checkpoint holds no loader state under 'loader'"):
        dcp_runs.restore(fresh, str(tmp_path), ReshardingLoadPlanner())


@pytest.mark.parametrize("kind", KINDS)
def test_the_loader_itself_as_a_dcp_value_is_answered(tmp_path, kind):
    """The issue's first try: the loader itself in the state dict. Saved that way, a load
    through ``ReshardingLoadPlanner`` says the checkpoint holds the loader's own state and how
    to save it instead; loading into the loader itself says to wrap it."""
    run, _loop, _ = trained_until(kind, STOP[kind])
    dcp.save({"model": run.model, "loader": run.loader}, checkpoint_id=str(tmp_path / "direct"))
    fresh = dcp_runs.build(kind)
    with pytest.raises(
        CheckpointException, match="TypeError: 'loader' is a .*SiftingDataloader itself.*PerRankLoaderState"
    ):
        dcp.load(
            {"model": fresh.model, "loader": fresh.loader},
            checkpoint_id=str(tmp_path / "direct"),
            planner=ReshardingLoadPlanner(),
        )
    with pytest.raises(CheckpointException, match="ValueError: the checkpoint's 'loader' holds a loader's own state"):
        dcp.load(
            {"model": fresh.model, "loader": PerRankLoaderState(fresh.loader)},
            checkpoint_id=str(tmp_path / "direct"),
            planner=ReshardingLoadPlanner(),
        )


def test_an_entry_that_is_no_loader_state_is_refused(tmp_path):
    run = dcp_runs.build("epoch")
    adapter = PerRankLoaderState(run.loader)
    with pytest.raises(
        ValueError, match="loader entry 'rank0_of1' of the checkpoint is a str, not a saved loader state"
    ):
        adapter.load_state_dict({"rank0_of1": "text"})
    with pytest.raises(ValueError, match="no loader state of this process .*rank0_of1.*rank1_of2"):
        adapter.load_state_dict({"rank1_of2": b""})


# -- under torchrun: each rank's state, the same and another world size ---------------------

WORKER = os.path.join(os.path.dirname(__file__), "dcp_worker.py")
RANK_KINDS = ["epoch", "per-batch", "wrapped-epoch", "alone-epoch", "alone-per-batch"]
# On 2 ranks: the second of 3 sifted steps of the epoch loaders (after 6 warm-up steps; the
# wrapped one 3 batches into its second epoch of 5); the first of the per-batch loaders' 2 or
# 3 steps in their second epoch (after 4 in the first).
RANK_STOP = {"epoch": 8, "per-batch": 5, "wrapped-epoch": 8, "alone-epoch": 8, "alone-per-batch": 5}
RESHARDED = ["epoch", "wrapped-epoch"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every kind's run on 2 ranks, checkpointed after RANK_STOP steps (the epoch loader with
    dcp.async_save in its own gloo group while training goes on)."""
    tmp = tmp_path_factory.mktemp("dcp")
    stops = [str(RANK_STOP[kind]) for kind in RANK_KINDS]
    args = ["--phase", "save", "--ckpt", str(tmp / "ckpt"), "--stop", *stops]
    out = torchrun.launch(WORKER, tmp, 2, *args, tag="save")
    return tmp, torchrun.results(out, 2)


def load(saved, world):
    tmp, _ = saved
    out = torchrun.launch(WORKER, tmp, world, "--phase", "load", "--ckpt", str(tmp / "ckpt"), tag=f"load{world}")
    return torchrun.results(out, world, resumed=True)


@pytest.mark.slow
def test_each_rank_resumes_exactly_at_the_same_world_size(saved):
    """Every kind, the async save's included: each rank trains its uninterrupted run's rest and
    ends with its weights. The loaders built with ``distributed=False`` (each over its own half
    of the data) keep each rank's state: in 0.8.0 both ranks' entries were ``rank0_of1``, saved
    once, and rank 1 resumed rank 0's."""
    _, full = saved
    resumed = load(saved, 2)
    for kind in RANK_KINDS:
        assert full[0][kind]["params"] == full[1][kind]["params"]
        for r in range(2):
            steps = full[r][kind]["steps"]
            assert steps[RANK_STOP[kind] - 1][0] == steps[RANK_STOP[kind]][0] == 1  # in the middle of epoch 1
            assert resumed[r][kind]["steps"] == steps[RANK_STOP[kind] :], (kind, r)
            assert resumed[r][kind]["params"] == full[r][kind]["params"], (kind, r)
        if kind.startswith("alone-"):
            assert full[0][kind]["steps"] != full[1][kind]["steps"]  # each rank its own data
    assert [r[kind]["from_ranks"] for r in resumed for kind in RESHARDED] == [None] * 4  # each rank its own state


@pytest.mark.slow
def test_another_world_size_reshards_the_epoch_loaders_and_the_others_refuse(saved):
    """2 ranks saved, 3 load: the epoch loader, bare or wrapped, reaches
    ``load_state_dict_from_ranks`` with both old ranks' states; the interrupted epoch trains
    exactly its plan (the 2 ranks' steps up to the checkpoint, then the 3 ranks' rest), each
    sample once, nothing before the checkpoint again; the next epoch is planned and trained on
    3 ranks in lockstep. The per-batch loader, and any loader built with ``distributed=False``,
    refuses naming both world sizes."""
    _, full = saved
    resumed = load(saved, 3)
    for r in resumed:
        assert "saved by 2 process(es), this run has 3: SiftingDataloader resumes only" in r["per-batch"]["refused"]
        for kind in ("alone-epoch", "alone-per-batch"):
            assert "saved by 2 process(es), this run has 3" in r[kind]["refused"]
            assert "runs on its own in each process (distributed=False)" in r[kind]["refused"]
    for kind in RESHARDED:
        epoch = [r[kind] for r in resumed]
        assert [r["from_ranks"] for r in epoch] == [2, 2, 2]
        assert all(r["params"] == epoch[0]["params"] for r in epoch)
        before = [step for r in full for step in r[kind]["steps"][: RANK_STOP[kind]]]
        after = [step for r in epoch for step in r["steps"]]
        assert {e for e, _ in after} == {1, 2}, kind  # nothing of the warm-up epoch again
        plans = {1: full[0][kind]["plans"]["1"], 2: epoch[0]["plans"]["2"]}
        assert len(plans[2]) == dcp_runs.SAMPLES  # the annealing epoch, planned for 3 ranks: every sample
        for n in (1, 2):
            trained = [i for e, ids in before + after if e == n for i in ids]
            assert len(trained) == len(set(trained)), f"{kind}, epoch {n}: a sample trained twice"
            assert sorted(trained) == sorted(plans[n]), f"{kind}, epoch {n}: trained != plan"
            assert len({sum(1 for e, _ in r["steps"] if e == n) for r in epoch}) == 1  # lockstep


def test_a_wrapped_loader_resumes_exactly_through_its_wrapper(tmp_path):
    """A loader inside ``ExactLengthLoader`` (what Lightning's and the Trainer's users train
    from) is saved and loaded through the wrapper, mid-epoch: the rest of the run is the
    uninterrupted run's."""
    from tests.neuron_sift.integrations.test_exact_length import epoch_loader, train

    expected = train(ExactLengthLoader(epoch_loader(), epochs=5), 5)
    first = ExactLengthLoader(epoch_loader(), epochs=5)
    before = train(first, 2)
    it = iter(first)
    for _ in range(3):  # three batches into the third epoch
        x, i = next(it)
        first.loader.weighted_loss(torch.nn.functional.mse_loss(x, torch.zeros_like(x), reduction="none").mean(1) + i)
    dcp.save({"loader": PerRankLoaderState(first)}, checkpoint_id=str(tmp_path))
    resumed = ExactLengthLoader(epoch_loader(), epochs=5)
    dcp.load({"loader": PerRankLoaderState(resumed)}, checkpoint_id=str(tmp_path), planner=ReshardingLoadPlanner())
    rest = train(resumed, 3)
    assert before == expected[:2] and rest[0] == expected[2][3:] and rest[1:] == expected[3:]


# -- one entry per process, whatever the loader's own ranks (issue 39) ----------------------


def on_two_processes(monkeypatch, work):
    """``work(rank)`` as process 0 and process 1 of a 2-process gloo group (threads of this
    process: ``ThreadWorld``), their results in rank order."""
    world = ThreadWorld(2)
    world.patch(monkeypatch)
    return world.run([lambda r=r: work(r) for r in range(2)])


def own_loader(kind, rank):
    """A loader built with ``distributed=False`` on each process of a 2-process job, over that
    process's half of the data (the opt-out of docs/data-parallel.md): it runs as rank 0 of 1."""
    data = Subset(dcp_runs.dataset(), range(rank, dcp_runs.SAMPLES, 2))
    if kind == "per-batch":

        class Score(Loss):
            def loss(self, model, transformed_batch, original_batch=None):
                return original_batch[1][:, 0] + original_batch[0].float()

        config = RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=16, selection_mode="fixed", seed=0)
        return SiftingDataloader(
            config, DataLoader(data, batch_size=4), loss_impl=Score(), model=torch.nn.Identity(), distributed=False
        )
    loader = EpochSiftingDataloader(
        {"seed": 3, "kept_share": 0.5}, DataLoader(data, batch_size=4), 3, distributed=False
    )
    return ExactLengthLoader(loader, epochs=3) if kind == "wrapped-epoch" else loader


def stepping(loader):
    """``loader``'s run, one batch's ids per step, epoch after epoch (losses recorded for the
    epoch loader), so that a test takes steps, saves, and goes on."""
    inner = getattr(loader, "loader", loader)
    while True:
        for ids, x, _y in loader:
            if hasattr(inner, "weighted_loss"):
                inner.weighted_loss(x[:, 0] + ids.float())
            yield ids.tolist()


def take(steps, count):
    return [next(steps) for _ in range(count)]


@pytest.mark.parametrize("kind", ["per-batch", "epoch", "wrapped-epoch"])
def test_loaders_that_run_alone_under_ddp_keep_each_process_state(monkeypatch, kind):
    """Each process's entry is keyed by its rank in the process group (``rank1_of2``), not by the
    loader's own (every one ``rank0_of1``, which DCP saves once); merged as DCP merges them (one
    value per key), every process resumes its own state. In 0.8.0 process 1 resumed process 0's
    state and trained process 0's batches, silently."""

    def save(rank):
        loader = own_loader(kind, rank)
        steps = stepping(loader)
        take(steps, 5)
        entries = PerRankLoaderState(loader).state_dict()
        return entries, take(steps, 4)

    saved = on_two_processes(monkeypatch, save)
    merged = {}
    for entries, _ in saved:  # DCP keeps one value per key for the whole job
        for key, blob in entries.items():
            merged.setdefault(key, blob)
    assert sorted(merged) == ["rank0_of2", "rank1_of2"]

    def load(rank):
        loader = own_loader(kind, rank)
        PerRankLoaderState(loader).load_state_dict(merged)
        return take(stepping(loader), 4)

    assert on_two_processes(monkeypatch, load) == [after for _, after in saved]


def test_an_entry_under_another_processs_key_is_refused(monkeypatch):
    """An entry names the process that wrote it; one found under another process's key (a
    checkpoint assembled by hand, a bug) is refused instead of resuming the wrong state."""
    saved = on_two_processes(monkeypatch, lambda rank: PerRankLoaderState(own_loader("epoch", rank)).state_dict())
    swapped = {"rank0_of2": saved[1]["rank1_of2"], "rank1_of2": saved[0]["rank0_of2"]}

    def load(rank):
        with pytest.raises(ValueError, match=f"written by process {1 - rank} of 2, not by process {rank} of 2"):
            PerRankLoaderState(own_loader("epoch", rank)).load_state_dict(swapped)

    on_two_processes(monkeypatch, load)


def test_a_loader_running_alone_is_refused_at_another_world_size(monkeypatch):
    """Its entries cannot be dealt to other processes: the refusal names both world sizes."""
    saved = on_two_processes(monkeypatch, lambda rank: PerRankLoaderState(own_loader("epoch", rank)).state_dict())
    entries = {**saved[0], **saved[1]}
    world = ThreadWorld(3)
    world.patch(monkeypatch)

    def load(rank):
        with pytest.raises(ValueError, match=r"saved by 2 process\(es\), this run has 3.*distributed=False"):
            PerRankLoaderState(own_loader("epoch", min(rank, 1))).load_state_dict(entries)

    world.run([lambda r=r: load(r) for r in range(3)])


def test_a_per_batch_entry_of_another_world_size_is_refused_naming_both():
    run = dcp_runs.build("per-batch")
    adapter = PerRankLoaderState(run.loader)
    entries = {f"rank{r}_of2": adapter.state_dict()["rank0_of1"] for r in range(2)}
    with pytest.raises(ValueError, match=r"saved by 2 process\(es\), this run has 1: SiftingDataloader resumes only"):
        adapter.load_state_dict(entries)


# -- damaged entries: one refusal naming the entry and the checkpoint (issue 39) ------------


def flipped(data: bytes, at: int) -> bytes:
    damaged = bytearray(data)
    damaged[at] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize("kind", KINDS)
def test_every_damaged_byte_of_an_entry_is_refused_by_name_or_changes_nothing(kind):
    """Every 7th byte of a saved entry flipped in turn: each load either refuses with one
    ``ValueError`` naming the entry (never an ``UnpicklingError``, a zip ``RuntimeError``, a
    ``KeyError`` ... from inside ``torch.load``, as 0.8.0 gave for half of them), or, where
    the byte was one ``torch.load`` does not read (the archive's padding and checksums of its
    own), restores exactly the saved state."""
    run, _loop, _ = trained_until(kind, STOP[kind])
    ((key, blob),) = PerRankLoaderState(run.loader).state_dict().items()
    saved = run.loader.state_dict()["checksum"]
    refused = accepted = 0
    for at in range(0, len(blob), 7):
        fresh = dcp_runs.build(kind)
        try:
            PerRankLoaderState(fresh.loader).load_state_dict({key: flipped(blob, at)})
        except ValueError as exc:
            assert str(exc).startswith(f"the loader entry '{key}' of the checkpoint"), (at, exc)
            refused += 1
        else:
            assert fresh.loader.state_dict()["checksum"] == saved, at
            accepted += 1
    assert refused > (refused + accepted) // 4
    for junk in (b"", b"junk", b"PK\x03\x04" + bytes(40)):
        with pytest.raises(ValueError, match=f"the loader entry '{key}' of the checkpoint cannot be read"):
            PerRankLoaderState(dcp_runs.build(kind).loader).load_state_dict({key: junk})


def test_a_damaged_entry_in_a_dcp_checkpoint_names_the_entry_and_the_checkpoint(tmp_path):
    """Bytes of the entry flipped in the checkpoint's file: ``dcp.load`` with the planner fails
    naming the entry and the checkpoint (DCP wraps it in its ``CheckpointException``)."""
    run, _loop, _ = trained_until("epoch", STOP["epoch"])
    dcp.save(dcp_runs.checkpoint_state(run), checkpoint_id=str(tmp_path))
    storage = FileSystemReader(str(tmp_path)).read_metadata().storage_data
    ((index, info),) = [(i, s) for i, s in storage.items() if i.fqn == "loader.rank0_of1"]
    path = tmp_path / info.relative_path
    original = path.read_bytes()
    refused = 0
    for at in range(info.offset, info.offset + info.length, max(1, info.length // 40)):
        path.write_bytes(flipped(original, at))
        try:
            dcp_runs.restore(dcp_runs.build("epoch"), str(tmp_path), ReshardingLoadPlanner())
        except CheckpointException as exc:
            assert f"ValueError: the loader entry 'loader.rank0_of1' of the checkpoint '{tmp_path}'" in str(exc), at
            refused += 1
    assert refused >= 30


EXECUTED = []


def _record(what):
    EXECUTED.append(what)
    return what


class Executes:
    """Unpickled without ``weights_only``, it calls ``_record``: what a crafted checkpoint could run."""

    def __reduce__(self):
        return (_record, ("code ran",))


def test_entries_are_read_with_weights_only_and_code_in_them_never_runs(tmp_path):
    """An entry that would run code when unpickled is refused before anything of it runs, by the
    adapter (its blob) and by the planner (the value DCP itself unpickles: DCP's own planner
    reads every non-tensor value without ``weights_only``)."""
    EXECUTED.clear()
    buffer = io.BytesIO()
    torch.save(Executes(), buffer)
    with pytest.raises(ValueError, match="the loader entry 'rank0_of1' of the checkpoint cannot be read"):
        PerRankLoaderState(dcp_runs.build("epoch").loader).load_state_dict({"rank0_of1": buffer.getvalue()})
    dcp.save({"loader": RankStates({"rank0_of1": Executes()})}, checkpoint_id=str(tmp_path))
    assert EXECUTED == []
    with pytest.raises(
        CheckpointException, match="the loader entry 'loader.rank0_of1' of the checkpoint .* cannot be read"
    ):
        dcp.load(
            {"loader": PerRankLoaderState(dcp_runs.build("epoch").loader)},
            checkpoint_id=str(tmp_path),
            planner=ReshardingLoadPlanner(),
        )
    assert EXECUTED == []


# -- a wrapped epoch loader at another world size (issue 39) --------------------------------


def shared_stream():
    """What Lightning's users train from under DDP: ``ExactLengthLoader`` around an epoch loader
    that shares its work over the process group."""
    config = {"seed": 3, "kept_share": 0.5, "anneal_fraction": 0.34}
    loader = EpochSiftingDataloader(config, DataLoader(dcp_runs.dataset(), batch_size=4), 3)
    return ExactLengthLoader(loader, epochs=3)


def consumer_epochs(stream, epochs, start=0, stop=None, saves=None):
    """A loop over the stream's epochs; (plan epoch, ids) of each batch. ``stop``: after that many
    batches, the entries go to ``saves`` and the loop stops."""
    out = []
    for _ in range(start, epochs):
        for ids, x, _y in stream:
            stream.loader.weighted_loss(x[:, 0] + ids.float())
            out.append((stream.loader.plan.epoch, ids.tolist()))
            if len(out) == stop:
                saves.update(PerRankLoaderState(stream).state_dict())
                return out
    return out


@pytest.mark.parametrize("world", [1, 3])
def test_a_wrapped_epoch_loader_resumes_at_another_world_size(monkeypatch, world):
    """Saved by 2 processes in the sifted epoch, resumed by ``world``: the interrupted plan trains
    each of its samples once (before and after the resume), every process the same steps, the
    consumer's epoch keeps the batches it counted. In 0.8.0 the wrapper refused ("checkpoint
    has steps_per_epoch=5 but this loader has 10") naming neither world size."""
    entries, plan = {}, {}

    def save(rank):
        stream = shared_stream()
        before = consumer_epochs(stream, 3, stop=len(stream) + 3, saves=entries)
        plan[rank] = stream.loader.plan.order.tolist()
        return before, stream.steps_per_epoch

    saving = ThreadWorld(2)
    saving.patch(monkeypatch)
    saved = saving.run([lambda r=r: save(r) for r in range(2)])
    assert sorted(entries) == ["rank0_of2", "rank1_of2"] and saved[0][0][-1][0] == 1  # in the sifted epoch
    resuming = ThreadWorld(world)
    resuming.patch(monkeypatch)

    def load(rank):
        stream = shared_stream()
        PerRankLoaderState(stream).load_state_dict(entries)
        first_len = len(stream)
        after = consumer_epochs(stream, 3, start=1)
        return after, first_len, stream.steps_per_epoch, stream.loader.plan.order.tolist()

    resumed = resuming.run([lambda r=r: load(r) for r in range(world)])
    per_epoch = resumed[0][2]
    assert per_epoch != saved[0][1]  # this world size's epochs
    assert all(first_len == max(0, per_epoch - 3) for _, first_len, _, _ in resumed)  # 3 batches of it were counted
    trained = [i for before, _ in saved for e, ids in before if e == 1 for i in ids]
    trained += [i for after, _, _, _ in resumed for e, ids in after if e == 1 for i in ids]
    assert sorted(trained) == sorted(plan[0]), "the interrupted plan: each sample once"
    assert len({len(after) for after, _, _, _ in resumed}) == 1  # lockstep
    # The consumer's epochs left take this world size's rest of the plan: nothing past it, and of
    # its last epoch each sample once, at most the rounding's one batch per rank left out.
    last = [i for after, _, _, _ in resumed for e, ids in after if e == 2 for i in ids]
    assert all(e <= 2 for after, _, _, _ in resumed for e, _ in after)
    assert len(last) == len(set(last)) and set(last) <= set(resumed[0][3])
    assert 0 <= len(resumed[0][3]) - len(last) <= world * 4


def test_a_wrapped_state_of_another_world_size_is_refused_naming_both(monkeypatch):
    saving = ThreadWorld(2)
    saving.patch(monkeypatch)
    states = saving.run([lambda: shared_stream().state_dict() for _ in range(2)])
    ThreadWorld(1).patch(monkeypatch)
    with pytest.raises(ValueError, match="saved at world size 2, this loader runs at 1: resume every rank's state"):
        shared_stream().load_state_dict(states[0])
