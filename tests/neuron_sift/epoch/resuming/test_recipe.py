"""The documentation's preemption recipe (docs/checkpoints.md: its checkpoint functions and
its loop for ``EpochSiftingDataloader``), run as written on real files through what an elastic
job meets: a job of 2 ranks stopped, resumed on 1 rank, stopped again and resumed on 2
(``--nnodes=MIN:MAX``), and a checkpoint of a DDP model resumed on one process without DDP.

Ranks are threads (``thread_ranks.ThreadWorld`` in place of ``torch.distributed``), so the
whole sequence takes seconds; ``test_preemption.py`` runs the same code under torchrun with a
rank killed by SIGKILL. A job is stopped by raising ``Stopped`` between two steps, after the
step and any checkpoint due at it: what a kill leaves on disk.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld
from tests.neuron_sift.integrations.readme_examples import example

SECTIONS = ("Checkpoint files: per rank, atomic, newest complete checkpoint", "The loop: EpochSiftingDataloader")
N, BATCH, EPOCHS, EVERY = 160, 4, 6, 7  # 2 ranks: a full epoch is 20 steps, a sifted one (half) 10


def recipe() -> dict:
    """The page's checkpoint functions and loop, executed as one script."""
    namespace = {"__name__": "recipe"}
    code = "\n\n".join(example(title) for title in SECTIONS)
    exec(compile(code, "docs/checkpoints.md", "exec"), namespace)
    return namespace


class Stopped(Exception):
    """The job ends here, as a killed one does: nothing after this step runs."""


class Watched:
    """The loader as the recipe's loop sees it: logs each trained batch (the epoch in progress,
    the ids) and each plan it first sees, and stops the job after ``stop_after`` batches."""

    def __init__(self, inner: EpochSiftingDataloader, stop_after: int | None = None, step_sync=None) -> None:
        # step_sync: the ranks meet after every step, as DDP's all-reduce of the next step makes
        # them (so no thread rank saves a step while another has not yet saved an older one).
        self.inner, self.stop_after, self.step_sync = inner, stop_after, step_sync
        self.trained: list[tuple[int, list[int]]] = []
        self.plans: dict[int, list[int]] = {}  # this rank's plan of each epoch, as first seen in this job
        self.states_from_ranks: int | None = None  # how many ranks' states a resume at another world size took

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def load_state_dict_from_ranks(self, states) -> None:
        self.states_from_ranks = len(states)
        self.inner.load_state_dict_from_ranks(states)

    def __iter__(self):
        for batch in self.inner:
            plan = self.inner.plan
            self.plans.setdefault(plan.epoch, plan.order.tolist())
            yield batch
            if self.step_sync is not None:
                self.step_sync()
            self.trained.append((self.inner.epoch - 1, batch[0].tolist()))
            if len(self.trained) == self.stop_after:
                raise Stopped


def dataset() -> TensorDataset:
    x = torch.randn(N, 8, generator=torch.Generator().manual_seed(1))
    return TensorDataset(torch.arange(N), x, (x[:, 0] + x[:, 1] > 0).long())


def per_sample_loss(model, batch):
    _ids, x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def training_parts():
    """What the script builds at every start before it loads a checkpoint (the loader apart)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    return model, optimizer, scheduler


def new_loader(data, table: str) -> EpochSiftingDataloader:
    config = {
        "kept_share": 0.5,
        "anneal_fraction": 0.2,
        "seed": 0,
        "score_table": table,
        **PRUNE_FROM_THE_START,
    }  # epoch 5 anneals
    return EpochSiftingDataloader(config, DataLoader(data, batch_size=BATCH, shuffle=True), num_epochs=EPOCHS)


def job(steps: dict, ckpt_dir: str, world: int, table: str, monkeypatch, stop_after: int | None = None):
    """One launch of the recipe's script on ``world`` ranks; each rank's (Watched, the step the
    loop returned, or None when the job was stopped)."""
    data = dataset()
    parts = [training_parts() for _ in range(world)]  # built here: threads would share torch's seed
    threads = ThreadWorld(world) if world > 1 else None

    def rank(r: int):
        model, optimizer, scheduler = parts[r]
        watched = Watched(new_loader(data, table), stop_after, threads.barrier_wait if threads else None)
        try:
            last = steps["train_epoch_sifting"](
                model, watched, optimizer, scheduler, per_sample_loss, ckpt_dir, EPOCHS, EVERY
            )
        except Stopped:
            last = None
        return watched, last

    if threads is None:
        return [rank(0)]
    with monkeypatch.context() as patched:
        threads.patch(patched)
        return threads.run([lambda r=r: rank(r) for r in range(world)])


def trained_in(ranks, epoch: int, steps: range | None = None) -> list[int]:
    """The ids the ranks trained in ``epoch``; ``steps``: only the job's batches at those
    0-based indices (a job's index i is its (i + 1)-th step since its start)."""
    return [
        i
        for watched, _ in ranks
        for n, (e, ids) in enumerate(watched.trained)
        if e == epoch and (steps is None or n in steps)
        for i in ids
    ]


def plan_of(ranks, epoch: int) -> list[int]:
    """The epoch's plan over all ranks, sorted: the union of the ranks' plans as they first saw
    them (a replicated table's are equal, a sharded one's are disjoint)."""
    return sorted({i for watched, _ in ranks for i in watched.plans[epoch]})


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_a_job_that_shrinks_then_grows_again_resumes_from_its_newest_checkpoint(
    tmp_path, monkeypatch, one_thread, table
):
    """2 ranks stopped at step 45 (checkpoint 42; epoch 3, the third sifted one, runs steps
    41-50), 1 rank resumes from 42 and saves 49 and 56 before it is stopped at 57, 2 ranks
    start again: they resume from 56 (the newest checkpoint, of 1 rank) with the loader state
    dealt out by ``load_state_dict_from_ranks``, not from the older one of their own world
    size. The interrupted epoch trains its plan exactly once over the three jobs, the step
    counter runs on from 56, and the files left are the two newest steps."""
    steps = recipe()
    ckpts = str(tmp_path / "ckpts")
    two = job(steps, ckpts, 2, table, monkeypatch, stop_after=45)
    after_two = steps["checkpoints_on_disk"](ckpts)
    one = job(steps, ckpts, 1, table, monkeypatch, stop_after=15)  # steps 43 to 57
    after_one = steps["checkpoints_on_disk"](ckpts)
    again = job(steps, ckpts, 2, table, monkeypatch)

    assert one[0][0].states_from_ranks == 2  # the 2 ranks' states of step 42, dealt out to 1 rank
    assert [watched.states_from_ranks for watched, _ in again] == [1, 1]  # the 1 rank's state of step 56
    done = [len(watched.trained) for watched, _ in again]
    assert done[0] == done[1]  # lockstep
    assert [last for _, last in again] == [56 + done[0]] * 2  # resumed at 56: the step never moves back
    # Epoch 3 (the plan of the 2 ranks that opened it): their steps 41-42, the 1 rank's 43-56,
    # then the rest on 2 ranks again; nothing twice, nothing left out, and no step 57 of the
    # stopped job (its checkpoint was never written).
    trained = trained_in(two, 3, range(40, 42)) + trained_in(one, 3, range(14)) + trained_in(again, 3)
    assert len(trained) == len(set(trained)), "a sample of the resumed epoch trained twice"
    assert sorted(trained) == plan_of(two, 3)
    for epoch in (4, 5):  # planned for 2 ranks after the resume: each trains its plan, each sample once
        trained = trained_in(again, epoch)
        assert len(trained) == len(set(trained)) and sorted(trained) == plan_of(again, epoch)
        assert len(trained) == {4: N // 2, 5: N}[epoch]
    # What was on disk: the 2 ranks' two newest steps, then the 1 rank's two newest (the older
    # files of any world size removed by its saves), at the end the last job's two newest.
    assert after_two == {(35, 2): {0, 1}, (42, 2): {0, 1}}
    assert after_one == {(49, 1): {0}, (56, 1): {0}}
    newest = (56 + done[0]) // EVERY * EVERY
    assert steps["checkpoints_on_disk"](ckpts) == {(newest - EVERY, 2): {0, 1}, (newest, 2): {0, 1}}


def touch(ckpt_dir, step: int, rank: int, world: int) -> None:
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.save({"step": step}, os.path.join(ckpt_dir, f"step{step:09d}-rank{rank}-of{world}.pt"))


@pytest.mark.parametrize(
    ("files", "newest"),
    [
        ({(42, 2): {0, 1}, (49, 1): {0}, (56, 1): {0}}, (56, 1)),  # shrunk: the newer world size wins
        ({(42, 1): {0}, (49, 2): {0, 1}}, (49, 2)),  # grown
        ({(42, 2): {0, 1}, (49, 2): {0}}, (42, 2)),  # a rank died saving 49
        ({(42, 2): {0, 1}, (56, 3): {0, 2}}, (42, 2)),  # rank 1 of 3 never wrote 56
        ({(7, 2): {1}}, None),
        ({}, None),
    ],
)
def test_the_newest_checkpoint_every_rank_of_its_world_size_wrote_wins(tmp_path, files, newest):
    steps = recipe()
    for (step, world), ranks in files.items():
        for r in ranks:
            touch(tmp_path, step, r, world)
    (tmp_path / "step000000063-rank0-of1.pt.tmp").write_bytes(b"torn")  # a save cut short: never a checkpoint
    assert steps["newest_complete_checkpoint"](str(tmp_path)) == newest


def test_saves_and_resumes_remove_the_files_no_resume_can_need(tmp_path):
    """On one process after a job of 2: the resume removes a save not every rank finished
    (it would otherwise be completed by a later save of another run's state); each save keeps
    the two newest steps, whatever world size wrote the older ones."""
    steps, ckpts = recipe(), str(tmp_path)
    for step, ranks in ((35, (0, 1)), (42, (0, 1)), (49, (0,))):
        for r in ranks:
            touch(ckpts, step, r, 2)
    assert steps["load_checkpoint"](ckpts, {}) == {"step": 42}
    assert steps["checkpoints_on_disk"](ckpts) == {(35, 2): {0, 1}, (42, 2): {0, 1}}
    steps["save_checkpoint"](ckpts, 49, {})
    assert steps["checkpoints_on_disk"](ckpts) == {(42, 2): {0, 1}, (49, 1): {0}}
    steps["save_checkpoint"](ckpts, 56, {})
    assert steps["checkpoints_on_disk"](ckpts) == {(49, 1): {0}, (56, 1): {0}}
    assert steps["load_checkpoint"](ckpts, {}) == {"step": 56}


def test_a_checkpoint_of_a_ddp_model_resumes_on_one_process_without_ddp(tmp_path, one_thread):
    """The model trained under DDP (a process group of one gloo rank) and stopped after step
    10; resumed on one process with the plain model, as a job shrunk to one process runs it:
    the checkpoint's keys are the model's own, and the run ends with the uninterrupted plain
    run's step and weights."""
    steps, data = recipe(), dataset()

    def run(ckpt_dir, model, optimizer, scheduler, stop_after=None):
        loader = Watched(new_loader(data, "replicated"), stop_after)
        return steps["train_epoch_sifting"](
            model, loader, optimizer, scheduler, per_sample_loss, ckpt_dir, EPOCHS, EVERY
        )

    reference, *rest = training_parts()
    uninterrupted = run(str(tmp_path / "reference"), reference, *rest)

    ckpts = str(tmp_path / "ckpts")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, *rest = training_parts()
        with pytest.raises(Stopped):
            run(ckpts, DistributedDataParallel(model), *rest, stop_after=10)
    finally:
        dist.destroy_process_group()
    saved = torch.load(os.path.join(ckpts, f"step{EVERY:09d}-rank0-of1.pt"), weights_only=True)
    assert set(saved["model"]) == {"weight", "bias"}  # not DDP's "module.weight"
    model, *rest = training_parts()
    assert run(ckpts, model, *rest) == uninterrupted
    for resumed, expected in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(resumed, expected)
