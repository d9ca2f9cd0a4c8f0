"""Both Trainer integrations coordinate over the Trainer's data-parallel ranks, not over
whatever ``torch.distributed`` holds: the decision for each parallel mode (no processes),
the integrations wired to it (ranks as threads of this process), and real Trainers under
``torchrun`` (slow)."""

import logging

import pytest
import torch

from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting
from neuron_sift.integrations.hf_trainer import ranks
from neuron_sift.integrations.hf_trainer.ranks import (
    TrainerWorld,
    loader_shards,
    not_parallel_notice,
    read_trainer_world,
    sifting_distributed,
)
from neuron_sift.integrations.trainer import enable_sifting
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld
from tests.neuron_sift.integrations.hf_trainer.fake_trainer import SAMPLES, FakeTrainer, train_loader
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import SiftBertLoss, sift_config
from tests.neuron_sift.torchrun import launch, results

EPOCH_CONFIG = {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.25}

# -- the decision --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, processes, torch_ranks, shards, distributed",
    [
        ("not_parallel", 1, 1, 1, False),  # one process
        ("not_parallel", 1, 2, 1, False),  # torchrun without use_cpu on CPU: a gloo group, no DDP
        ("not_distributed", 1, 1, 1, False),  # one process driving nn.DataParallel
        ("tpu", 1, 1, 1, False),  # one XLA device
        ("distributed", 1, 1, 1, False),  # accelerate's MULTI_CPU launched as one process
        ("distributed", 2, 2, 2, True),  # DDP: the loader shards over the Trainer's ranks
        ("distributed", 4, 4, 4, True),
        ("tpu", 4, 4, 4, True),  # XLA processes with the xla process group
        ("sagemaker_data_parallel", 2, 2, 2, True),
        ("distributed", 2, 2, None, True),  # batches dispatched by accelerate: shards unknown
    ],
)
def test_the_loader_coordinates_over_the_trainers_data_parallel_ranks(
    mode, processes, torch_ranks, shards, distributed
):
    world = TrainerWorld(processes, mode, "MULTI_CPU" if processes > 1 else "NO")
    assert sifting_distributed(world, torch_ranks, shards) is distributed


@pytest.mark.parametrize(
    "mode, processes, torch_ranks, shards, message",
    [
        ("distributed", 2, 1, 2, "trains data-parallel over 2 processes; .* but torch.distributed is not initialised"),
        ("distributed", 2, 4, 2, "trains data-parallel over 2 processes; .* but torch.distributed has 4 ranks"),
        ("tpu", 4, 1, 4, r"init_process_group\('xla', init_method='xla://'\)"),
        ("distributed", 4, 4, 2, "over 4 processes; .* but its train loader is sharded over 2 process"),  # TP
        ("distributed", 4, 4, 1, "sharded over 1 process.*tensor, context or model parallelism"),
    ],
)
def test_worlds_that_disagree_are_refused_naming_both(mode, processes, torch_ranks, shards, message):
    with pytest.raises(ValueError, match=message):
        sifting_distributed(TrainerWorld(processes, mode, "MULTI_CPU"), torch_ranks, shards)


def test_the_not_parallel_notice_names_both_worlds():
    notice = not_parallel_notice(TrainerWorld(1, "not_parallel", "NO"), 2)
    assert notice is not None
    assert "torch.distributed has 2 ranks" in notice and "args.parallel_mode=not_parallel" in notice
    assert "distributed_type=NO" in notice and "use_cpu=True" in notice
    assert not_parallel_notice(TrainerWorld(1, "not_parallel", "NO"), 1) is None
    assert not_parallel_notice(TrainerWorld(2, "distributed", "MULTI_CPU"), 2) is None


def test_the_trainers_world_is_read_from_its_accelerator_then_its_arguments():
    trainer = FakeTrainer(train_loader(), "distributed", 2, "MULTI_CPU")
    assert read_trainer_world(trainer) == TrainerWorld(2, "distributed", "MULTI_CPU")
    trainer.args.world_size = 3  # the accelerator's count is what accelerate shards the loader by
    assert read_trainer_world(trainer).processes == 2
    del trainer.accelerator  # a Trainer without one: args.world_size
    assert read_trainer_world(trainer) == TrainerWorld(3, "distributed", "unknown")


def test_the_loaders_shards_are_read_from_accelerates_batch_sampler():
    assert loader_shards(train_loader()) == 1
    assert loader_shards(train_loader(shards=2)) == 2

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    assert loader_shards(torch.utils.data.DataLoader(Stream(), batch_size=2)) is None


# -- the integrations, ranks as threads ---------------------------------------------------


def on_two_ranks(monkeypatch, work):
    """``work(rank)`` on 2 threads seen by torch.distributed as a gloo group of 2 ranks."""
    world = ThreadWorld(2)
    world.patch(monkeypatch)
    return world.run([lambda r=r: work(r) for r in range(2)])


def first_epoch_ids(loader):
    """The samples of this rank's first epoch, trained as the Trainer trains them (a loss for each batch)."""
    ids = []
    for (batch,) in loader:
        loader.weighted_loss(torch.zeros(len(batch)))
        ids.extend(int(i) for i in batch)
    return sorted(ids)


def test_epoch_sifting_plans_the_whole_epoch_where_the_trainer_trains_each_process_alone(monkeypatch, caplog):
    """accelerate's gloo group under torchrun without DDP: every process trains all the data,
    so every rank plans the same whole epoch, as one process does (sharded, the ranks would
    train different halves with nothing to average their weights)."""

    def rank(r):
        trainer = enable_epoch_sifting(FakeTrainer(train_loader()), EPOCH_CONFIG)
        trainer.get_train_dataloader()
        loader = trainer.epoch_sifting_dataloader
        return loader.ranks.world_size, first_epoch_ids(loader)

    with caplog.at_level(logging.WARNING, logger=ranks.__name__):
        (world0, ids0), (world1, ids1) = on_two_ranks(monkeypatch, rank)
    assert world0 == world1 == 1
    assert ids0 == ids1 == list(range(SAMPLES))  # the warm-up epoch: every sample on each rank
    assert any("torch.distributed has 2 ranks" in m for m in caplog.messages)


def test_sifting_draws_as_one_process_where_the_trainer_trains_each_process_alone(monkeypatch):
    def rank(r):
        trainer = enable_sifting(FakeTrainer(train_loader()), sift_config("probabilistic", delay=0), SiftBertLoss())
        trainer.get_train_dataloader()
        return trainer.sifting_dataloader.ranks.world_size

    assert on_two_ranks(monkeypatch, rank) == [1, 1]


def test_a_trainer_sharding_over_the_ranks_still_shards_the_plan(monkeypatch):
    def rank(r):
        trainer = FakeTrainer(train_loader(shards=2, rank=r), "distributed", 2, "MULTI_CPU")
        enable_epoch_sifting(trainer, EPOCH_CONFIG).get_train_dataloader()
        loader = trainer.epoch_sifting_dataloader
        per_batch = FakeTrainer(train_loader(shards=2, rank=r), "distributed", 2, "MULTI_CPU")
        enable_sifting(per_batch, sift_config("probabilistic", delay=0), SiftBertLoss()).get_train_dataloader()
        return loader.ranks.world_size, first_epoch_ids(loader), per_batch.sifting_dataloader.ranks.world_size

    (world0, ids0, per_batch0), (world1, ids1, per_batch1) = on_two_ranks(monkeypatch, rank)
    assert world0 == world1 == per_batch0 == per_batch1 == 2
    assert len(ids0) == len(ids1) == SAMPLES // 2 and sorted(ids0 + ids1) == list(range(SAMPLES))


@pytest.mark.parametrize("enable", ["epoch", "per_batch"])
def test_a_distributed_trainer_without_the_process_group_is_refused(enable):
    """The Trainer says 2 data-parallel processes, torch.distributed (not initialised here)
    says 1: neither loader guesses, both refuse naming the two worlds."""
    trainer = FakeTrainer(train_loader(shards=2), "distributed", 2, "MULTI_CPU")
    if enable == "epoch":
        enable_epoch_sifting(trainer, EPOCH_CONFIG)
    else:
        enable_sifting(trainer, sift_config("fixed", delay=0), SiftBertLoss())
    with pytest.raises(ValueError, match="over 2 processes; args.parallel_mode=distributed.*is not initialised"):
        trainer.get_train_dataloader()


# -- real Trainers under torchrun ----------------------------------------------------------

WORKER = __file__.replace("test_ranks.py", "trainer_ranks_worker.py")


@pytest.mark.slow
def test_real_trainers_under_torchrun(tmp_path, monkeypatch):
    """2 gloo ranks on CPU. Without use_cpu (no accelerator visible) the Trainer runs
    NOT_PARALLEL (accelerate 1.13 and later; DDP before): each process trains all the data on
    its own, and with either sifting mode the two processes train the same batches and end with
    identical weights, as without sifting. With use_cpu=True the Trainer trains DDP over both:
    the plan is still sharded, each rank training its half of every epoch."""
    monkeypatch.setenv("USE_TORCH_XLA", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    r0, r1 = results(launch(WORKER, tmp_path, 2), 2)

    check_ddp(r0["epoch_ddp"], r1["epoch_ddp"], r0["per_batch_ddp"], r1["per_batch_ddp"])
    # Without use_cpu, accelerate decides: before 1.13 a torchrun launch (WORLD_SIZE > 1) on CPU
    # trains MULTI_CPU, from 1.13 on only with cpu=True. Either way the loaders follow the Trainer.
    without_cpu = (r0["epoch_not_parallel"]["parallel_mode"], r0["epoch_not_parallel"]["distributed_type"])
    assert without_cpu in {("not_parallel", "NO"), ("distributed", "MULTI_CPU")}
    if without_cpu == ("distributed", "MULTI_CPU"):
        check_ddp(
            r0["epoch_not_parallel"],
            r1["epoch_not_parallel"],
            r0["per_batch_not_parallel"],
            r1["per_batch_not_parallel"],
        )
        return
    for name in ("epoch_not_parallel", "per_batch_not_parallel"):
        a, b = r0[name], r1[name]
        assert (a["parallel_mode"], a["distributed_type"], a["torch_world"]) == ("not_parallel", "NO", 2)
        assert not a["ddp_wrapped"] and a["loader_world"] == b["loader_world"] == 1
        assert a["weights"] == b["weights"], name  # the same computation on the same device
        assert any("torch.distributed has 2 ranks" in m for m in a["notices"])
    a, b = r0["epoch_not_parallel"], r1["epoch_not_parallel"]
    assert a["steps"] == b["steps"]  # the same samples in the same batches
    assert a["kinds"] == ["warmup", "sift", "sift", "anneal"]
    # each rank trained the whole plan: 8 + 4 + 4 + 8 batches of 8 from 64 samples
    assert a["global_step"] == len(a["steps"]) == 24
    assert sorted(i for step in a["steps"][:8] for i in step) == list(range(64))
    assert len({i for step in a["steps"][8:12] for i in step}) == 32
    assert r0["per_batch_not_parallel"]["samples_seen"] == 4 * 64  # 4 epochs of all the data


def check_ddp(a, b, per_batch_a, per_batch_b):
    """A Trainer training DDP over 2 ranks (ranks a and b): the plan sharded over both."""
    for r in (a, b):
        assert (r["parallel_mode"], r["distributed_type"], r["torch_world"]) == ("distributed", "MULTI_CPU", 2)
        assert r["ddp_wrapped"] and r["loader_world"] == 2 and not r["notices"]
    assert a["weights"] == b["weights"]  # DDP averaged the gradients
    assert a["global_step"] == b["global_step"] == 12  # half of every epoch on each rank
    assert sorted(i for step in a["steps"][:4] + b["steps"][:4] for i in step) == list(range(64))
    sifted = [i for step in a["steps"][4:6] + b["steps"][4:6] for i in step]
    assert len(sifted) == len(set(sifted)) == 32  # the sifted epoch's plan, dealt without overlap
    a, b = per_batch_a, per_batch_b
    assert a["loader_world"] == b["loader_world"] == 2 and a["weights"] == b["weights"]
    assert a["global_step"] == b["global_step"]  # probabilistic draws, the same steps on both ranks
    assert a["samples_seen"] == b["samples_seen"] == 4 * 32  # each rank's shard of 4 epochs
