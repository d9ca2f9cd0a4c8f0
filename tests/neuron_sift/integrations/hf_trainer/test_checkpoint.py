"""``trainer.train(resume_from_checkpoint=...)`` with sifting, both modes: the Trainer's own
checkpoints carry the sifting state, and a run resumed from the middle of a Trainer epoch or
from an epoch's end trains what the uninterrupted run trained after that checkpoint.

The Trainer runs happen in subprocesses (``trainer_resume_scenarios.py``; transformers picks
torch-xla at import), on the CPU and on torch-xla's CPU device. Before this, a mid-epoch
resume failed inside accelerate's ``skip_first_batches`` with a bare ``AttributeError``
(``'ExactLengthLoader' object has no attribute 'sampler'``) in the per-batch mode and was
refused in the epoch mode, and an epoch-end resume of the per-batch mode silently sifted
afresh (the delay again, other samples); the comparisons below fail on each of those.
"""

import functools
import itertools
import json
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from neuron_sift.integrations.hf_trainer.checkpoint import (
    RESUMED,
    TrainerCheckpoints,
    load_state,
    restore,
    skip_stream,
    state_file,
)
from neuron_sift.integrations.schedules import ExactLengthLoader
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import run_python
from tests.neuron_sift.integrations.readme_examples import example

MODES = ("sifting", "epoch_sifting")
CALLS = {"sifting": "enable_sifting", "epoch_sifting": "enable_epoch_sifting"}
CPU_RUNS = [pytest.param(mode, "cpu", id=f"{mode}-cpu", marks=pytest.mark.slow) for mode in MODES]
XLA_RUNS = [pytest.param(mode, "xla", id=f"{mode}-xla", marks=[pytest.mark.slow, pytest.mark.xla]) for mode in MODES]
RUNS = CPU_RUNS + XLA_RUNS


@functools.cache
def resumed_runs(mode, device):
    env = {"USE_TORCH_XLA": "1" if device == "xla" else "0", "PJRT_DEVICE": "CPU"}
    out = run_python(["-m", "tests.neuron_sift.integrations.hf_trainer.trainer_resume_scenarios", mode, device], env)
    (line,) = [x for x in out.splitlines() if x.startswith("RESULTS ")]
    return json.loads(line[len("RESULTS ") :])


def check_uninterrupted_run(mode, r):
    """The run the others are compared with sifted (so equal counts are not trivially equal)."""
    assert r["per_epoch"] == (4 if mode == "sifting" else 6) and len(r["full_steps"]) == 4 * r["per_epoch"]
    s = r["full_sifting"]
    if mode == "sifting":
        assert s["num_source_batches_delayed"] == 2  # the delay, once
        assert 0 < s["num_orig_samples_kept"] < s["num_orig_samples_seen"]
    else:
        assert s["epochs"] == [["warmup", 64], ["sift", 32], ["sift", 32], ["anneal", 64]]
        assert s["unpaired"] == 0 and s["scores_recorded"] == 64


@pytest.mark.parametrize("point", ["mid_epoch", "epoch_end", "mid_epoch_through_module"])
@pytest.mark.parametrize(("mode", "device"), RUNS)
def test_a_resumed_run_trains_what_the_uninterrupted_run_trained_after_the_checkpoint(mode, device, point):
    """The same samples in the same batches, bitwise the same weights, the same sifting
    counts (per-batch) or plans (epoch). ``mid_epoch_through_module``: the Trainer skips
    through the name ``transformers.trainer`` imports accelerate's ``skip_first_batches``
    by, as transformers 4.x does (the Neuron container's 4.56)."""
    r = resumed_runs(mode, device)
    check_uninterrupted_run(mode, r)
    resumed, per_epoch = r[point], r["per_epoch"]
    step = resumed["from_step"]
    assert step == (per_epoch + per_epoch // 2 if point.startswith("mid_epoch") else 2 * per_epoch)
    assert resumed["steps"] == r["full_steps"][step:]
    assert resumed["global_step"] == len(r["full_steps"])
    assert resumed["same_weights"]
    assert resumed["sifting"] == r["full_sifting"]


@pytest.mark.parametrize(("mode", "device"), RUNS)
def test_the_trainers_checkpoints_hold_the_sifting_state(mode, device):
    r = resumed_runs(mode, device)
    per_epoch = r["per_epoch"]
    assert r["checkpoints"] == [per_epoch, per_epoch + per_epoch // 2, 2 * per_epoch]  # the steps saved at
    assert f"{mode}_rank0.pt" in r["saved"]


@pytest.mark.parametrize(("mode", "device"), RUNS)
def test_resumes_that_cannot_be_exact_are_refused(mode, device):
    refused = resumed_runs(mode, device)["refused"]
    message = refused["no_sifting_state"]
    assert message.startswith("ValueError: ") and f"holds no {mode}_rank0.pt" in message
    assert f"the checkpoint was not saved by a Trainer with {CALLS[mode]}" in message
    message = refused["ignore_data_skip"]
    assert message.startswith("ValueError: ") and "batches into a Trainer epoch and ignore_data_skip=True" in message
    assert "set ignore_data_skip=False" in message
    if mode == "sifting":
        assert refused["unsized"] == (
            "ValueError: enable_sifting resumes a checkpoint through the sifted stream of a train dataset with a "
            "length; this train dataset has none. Train without resume_from_checkpoint, or give the dataset a length"
        )


@pytest.mark.parametrize(("mode", "device"), XLA_RUNS)
def test_no_graph_is_compiled_after_the_first_epoch_of_any_run(mode, device):
    """Compilations counted at each Trainer epoch's end (the process's count: the resumed
    runs follow the uninterrupted one in the same process)."""
    r = resumed_runs(mode, device)
    trained_epochs = {"full_compiles": 4, "mid_epoch": 3, "epoch_end": 2, "mid_epoch_through_module": 3}
    for name, epochs in trained_epochs.items():
        counts = r[name] if name == "full_compiles" else r[name]["compiles"]
        assert len(counts) == epochs and counts[0] > 0, (name, counts)
        assert counts[1:] == [counts[0]] * (epochs - 1), (name, counts)


# -- the Trainer's skip, answered by the stream (in this process, without a Trainer) -----------


def stream(per_epoch=4):
    loader = EpochSiftingDataloader({"seed": 0}, DataLoader(TensorDataset(torch.arange(16)), batch_size=4))
    return ExactLengthLoader(loader, per_epoch)


def trained(stream, iterator, batches=None):
    """Train ``batches`` batches of ``iterator`` (all when None), each loss recorded as a
    Trainer step records it; their sample ids."""
    out = []
    for (ids,) in itertools.islice(iterator, batches):
        stream.loader.weighted_loss(ids.float())
        out.append(ids.tolist())
    return out


def resuming_trainer():
    """What the checkpoints read of a Trainer: its arguments, the hook answering its skip
    (over the Trainer's own skip) and the stream it trains from."""
    trainer = SimpleNamespace(args=SimpleNamespace(ignore_data_skip=False), train=lambda *a, **k: None)
    trainer.get_resumed_dataloader = lambda dataloader, num_batches: ("the Trainer's own skip", num_batches)
    checkpoints = TrainerCheckpoints(trainer, "epoch_sifting", "epoch_sifting_stream")
    trainer.get_resumed_dataloader = checkpoints.methods()[RESUMED]
    trainer.checkpoints = checkpoints
    return trainer


def test_a_mid_epoch_state_waits_for_the_skip_and_continues_the_epoch():
    first = stream()
    it = iter(first)
    assert len(trained(first, it, 3)) == 3
    state = first.state_dict()
    rest = trained(first, it)
    trainer = resuming_trainer()
    resumed = stream()
    restore(trainer, resumed, state)
    assert len(resumed) == 4  # the Trainer reads the whole epoch's length before its skip
    with pytest.raises(ValueError, match="resumes 2 batches into its epoch but the sifting checkpoint was taken 3"):
        trainer.get_resumed_dataloader(resumed, 2)
    restore(trainer, resumed, state)
    assert trainer.get_resumed_dataloader(resumed, 3) is resumed
    assert len(resumed) == 1 and len(rest) == 1 and trained(resumed, iter(resumed)) == rest
    # every other loader goes to the Trainer's own skip
    assert trainer.get_resumed_dataloader([1, 2], 1) == ("the Trainer's own skip", 1)


def test_a_skip_of_a_stream_without_a_checkpoint_is_refused():
    with pytest.raises(ValueError, match="skip 2 batches of a sifted stream that holds no mid-epoch checkpoint"):
        skip_stream(stream(), 2)


def test_an_epoch_end_state_is_loaded_at_once():
    first = stream()
    trained(first, iter(first))
    state = first.state_dict()
    following = trained(first, iter(first))
    resumed = stream()
    restore(resuming_trainer(), resumed, state)
    assert len(resumed) == 4 and trained(resumed, iter(resumed)) == following and len(following) == 4


@pytest.mark.slow
def test_the_docs_resume_example(tmp_path):
    script = tmp_path / "resume_example.py"
    script.write_text(example("Resuming from the Trainer's checkpoints"), encoding="utf-8")
    out = run_python([str(script)], {"USE_TORCH_XLA": "0"}, cwd=tmp_path).splitlines()
    assert "checkpoints: ['checkpoint-3', 'checkpoint-6', 'checkpoint-9']" in out
    assert "resumed run ended at step 24 with the uninterrupted run's weights: True" in out


def test_a_step_trained_before_the_skip_is_refused():
    """A Trainer that never asked to skip a mid-epoch checkpoint's batches would train that
    epoch from a fresh stream: its first step is refused."""
    first = stream()
    trained(first, iter(first), 2)
    trainer = resuming_trainer()
    trainer.epoch_sifting_stream = stream()
    restore(trainer, trainer.epoch_sifting_stream, first.state_dict())
    with pytest.raises(RuntimeError, match="resumed a mid-epoch checkpoint without skipping the epoch's trained"):
        trainer.checkpoints.callback().on_step_begin(None, None, None)


def test_each_process_reads_its_own_file_or_process_0s_where_all_sift_alike(tmp_path):
    torch.save({"kind": "a state"}, tmp_path / state_file("sifting", 0))
    assert load_state(str(tmp_path), "sifting", 1, unsharded=True) == {"kind": "a state"}
    with pytest.raises(ValueError, match="holds no sifting_rank1.pt: the checkpoint was not saved by a Trainer with"):
        load_state(str(tmp_path), "sifting", 1)


@pytest.mark.slow
def test_gradient_accumulation_resumes_from_every_checkpoint_of_runs_ending_epochs_on_short_steps():
    """Accumulation 2 and 3 over Trainer epochs of 7 batches (each ends on a short
    optimizer step), resumed from every checkpoint: each run trains what the uninterrupted
    run trained after it, to its last step. In 0.8.0 resuming before a short step raised
    ``LossOutputException: ... holds at most 1 batch(es)`` at the next epoch (the loader was
    never told the accumulation)."""
    out = run_python(
        ["-m", "tests.neuron_sift.integrations.hf_trainer.trainer_accumulation_scenarios"], {"USE_TORCH_XLA": "0"}
    )
    (line,) = [x for x in out.splitlines() if x.startswith("RESULTS ")]
    results = json.loads(line[len("RESULTS ") :])
    for accumulation, r in results.items():
        accumulation = int(accumulation)
        assert r["per_epoch"] % accumulation != 0, "each epoch ends on a short step"
        assert len(r["resumed"]) == r["global_step"] >= 6  # a checkpoint after every optimizer step
        updates_per_epoch = r["global_step"] // 2
        for name, resumed in r["resumed"].items():
            assert "error" not in resumed, (accumulation, name, resumed)
            after = r["full"][len(r["full"]) - len(resumed["steps"]) :]
            assert len(resumed["steps"]) == len(after), (accumulation, name)
            assert resumed["steps"] or name == f"checkpoint-{r['global_step']}", (accumulation, name)
            done = int(name.split("-")[1]) % updates_per_epoch
            if r["transformers_major"] < 5 and done:
                # transformers 4.x's own resume, the same with a plain DataLoader: the skipped
                # epoch's step count restarts at 0, so its short last step is never taken (one
                # optimizer step fewer; its gradient joins the next step). The rest of that epoch
                # is still exactly the uninterrupted run's; later plans follow other weights.
                assert resumed["global_step"] == r["global_step"] - 1, (accumulation, name)
                rest = r["per_epoch"] - done * accumulation
                assert resumed["steps"][:rest] == after[:rest], (accumulation, name)
            else:
                assert resumed["global_step"] == r["global_step"], (accumulation, name)
                assert resumed["steps"] == after, (accumulation, name)


def test_each_process_writes_its_own_file_into_a_checkpoint(tmp_path):
    """Process 1 of a Trainer writes ``epoch_sifting_rank1.pt``: were every process to write
    under process 0's name, one file would hold one process's stream and every process would
    resume it."""
    trainer = resuming_trainer()
    trainer.args.process_index = 1
    trainer.epoch_sifting_stream = stream()
    args = SimpleNamespace(output_dir=str(tmp_path))
    trainer.checkpoints.callback().on_save(args, SimpleNamespace(global_step=7), None)
    assert sorted(p.name for p in (tmp_path / "checkpoint-7").iterdir()) == [state_file("epoch_sifting", 1)]
    saved = load_state(str(tmp_path / "checkpoint-7"), "epoch_sifting", 1)
    assert saved["steps_per_epoch"] == 4
