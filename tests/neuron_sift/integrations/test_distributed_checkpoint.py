"""Both sifting loaders checkpointed with torch.distributed.checkpoint (DCP) on one process,
beside the model and optimizer, as docs/checkpoints.md shows: a checkpoint in the middle of
a sifted epoch, loaded into a freshly built run, continues with the uninterrupted run's
batches and ends with its weights, bit for bit; an ``async_save`` in flight while training
goes on holds the state of the step it was taken at; wrong uses get errors that say what to
do. Then under torchrun (``dcp_worker.py``, 2 gloo ranks): each rank resumes exactly at the
same world size; at 3 ranks the epoch loader reshards and the per-batch loader refuses.
"""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from neuron_sift.integrations import PerRankLoaderState, ReshardingLoadPlanner
from tests.neuron_sift import torchrun
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
    with pytest.raises(ValueError, match="loader entry 'rank0_of1' is a str, not a saved loader state"):
        adapter.load_state_dict({"rank0_of1": "text"})
    with pytest.raises(ValueError, match="no loader state of this rank .*rank0_of1.*rank1_of2"):
        adapter.load_state_dict({"rank1_of2": b""})


# -- under torchrun: each rank's state, the same and another world size ---------------------

WORKER = os.path.join(os.path.dirname(__file__), "dcp_worker.py")
# On 2 ranks: the epoch loader's second of 3 sifted steps (after 6 warm-up steps); the first of the
# per-batch loader's 2 steps in its second epoch (after 4 in the first).
RANK_STOP = {"epoch": 8, "per-batch": 5}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Both loaders' runs on 2 ranks, checkpointed with dcp.save after RANK_STOP steps."""
    tmp = tmp_path_factory.mktemp("dcp")
    stops = [str(RANK_STOP[kind]) for kind in KINDS]
    args = ["--phase", "save", "--ckpt", str(tmp / "ckpt"), "--stop", *stops]
    out = torchrun.launch(WORKER, tmp, 2, *args, tag="save")
    return tmp, torchrun.results(out, 2)


def load(saved, world):
    tmp, _ = saved
    out = torchrun.launch(WORKER, tmp, world, "--phase", "load", "--ckpt", str(tmp / "ckpt"), tag=f"load{world}")
    return torchrun.results(out, world, resumed=True)


@pytest.mark.slow
def test_each_rank_resumes_exactly_at_the_same_world_size(saved):
    _, full = saved
    resumed = load(saved, 2)
    for kind in KINDS:
        assert full[0][kind]["params"] == full[1][kind]["params"]
        for r in range(2):
            steps = full[r][kind]["steps"]
            assert steps[RANK_STOP[kind] - 1][0] == steps[RANK_STOP[kind]][0] == 1  # in the middle of epoch 1
            assert resumed[r][kind]["steps"] == steps[RANK_STOP[kind] :], (kind, r)
            assert resumed[r][kind]["params"] == full[r][kind]["params"], (kind, r)
    assert [r["epoch"]["from_ranks"] for r in resumed] == [None, None]  # each rank its own state


@pytest.mark.slow
def test_another_world_size_reshards_the_epoch_loader_and_the_per_batch_loader_refuses(saved):
    """2 ranks saved, 3 load: the epoch loader reaches ``load_state_dict_from_ranks`` with both
    old ranks' states; the interrupted epoch trains exactly its plan (the 2 ranks' steps up to
    the checkpoint, then the 3 ranks' rest), each sample once, nothing before the checkpoint
    again; the next epoch is planned and trained on 3 ranks in lockstep. The per-batch loader
    refuses with its own message."""
    _, full = saved
    resumed = load(saved, 3)
    for r in resumed:
        assert "SiftingDataloader does not resume at another world size" in r["per-batch"]["refused"]
    epoch = [r["epoch"] for r in resumed]
    assert [r["from_ranks"] for r in epoch] == [2, 2, 2]
    assert all(r["params"] == epoch[0]["params"] for r in epoch)
    before = [step for r in full for step in r["epoch"]["steps"][: RANK_STOP["epoch"]]]
    after = [step for r in epoch for step in r["steps"]]
    assert {e for e, _ in after} == {1, 2}  # nothing of the warm-up epoch again
    plans = {1: full[0]["epoch"]["plans"]["1"], 2: epoch[0]["plans"]["2"]}
    assert len(plans[2]) == dcp_runs.SAMPLES  # the annealing epoch, planned for 3 ranks: every sample
    for n in (1, 2):
        trained = [i for e, ids in before + after if e == n for i in ids]
        assert len(trained) == len(set(trained)), f"epoch {n}: a sample trained twice"
        assert sorted(trained) == sorted(plans[n]), f"epoch {n}: trained != plan"
        assert len({sum(1 for e, _ in r["steps"] if e == n) for r in epoch}) == 1  # lockstep


def test_a_wrapped_loader_resumes_exactly_through_its_wrapper(tmp_path):
    """A loader inside ``ExactLengthLoader`` (what Lightning's and the Trainer's users train
    from) is saved and loaded through the wrapper, mid-epoch: the rest of the run is the
    uninterrupted run's."""
    from neuron_sift.integrations.schedules import ExactLengthLoader
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
