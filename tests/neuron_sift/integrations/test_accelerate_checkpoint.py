"""Both sifting loaders registered with ``accelerator.register_for_checkpointing`` resume
exactly through ``accelerator.save_state`` / ``accelerator.load_state``.

``accelerate_runs.py`` trains as a user does with accelerate (model, optimizer and source
DataLoader prepared, the sifting loader built around them and registered beside the loop's
epoch), saves in the middle of an epoch and at an epoch's last batch, and resumes each save
in a run built afresh from other initial weights. The resumed runs must train the
uninterrupted run's remaining batches (the same sample ids, in the same epochs) and end
with its weights, bit for bit. On CPU (``USE_TORCH_XLA=0``) and on torch-xla's CPU device.
"""

import json

import pytest

from tests.neuron_sift.integrations.hf_trainer.trainer_harness import run_python
from tests.neuron_sift.integrations.readme_examples import example

MODES = ("sifting", "epoch")


def accelerate_runs(tmp_path, env):
    out = run_python(["-m", "tests.neuron_sift.integrations.accelerate_runs", ",".join(MODES), str(tmp_path)], env)
    (line,) = [x for x in out.splitlines() if x.startswith("RESULTS ")]
    return json.loads(line[len("RESULTS ") :])


def check_exact_resumes(runs, steps_at_least):
    for mode in MODES:
        r = runs[mode]
        assert r["prepare_returned_the_loader"]  # accelerate prepares only DataLoaders; a sifting loader passes through
        assert r["steps"] >= steps_at_least and 0 < r["first_epoch"] < r["steps"]
        assert r["saving_changed_nothing"], mode
        assert set(r["resumed"]) == {"mid_epoch", "epoch_end"}
        for where, resumed in r["resumed"].items():
            assert resumed["first_batches"] == resumed["expected_first_batches"], (mode, where)
            assert resumed["same_batches"], (mode, where)
            assert resumed["same_weights"], (mode, where, resumed["max_weight_difference"])


def test_save_state_and_load_state_resume_both_loaders_exactly_on_cpu(tmp_path):
    runs = accelerate_runs(tmp_path, {"USE_TORCH_XLA": "0"})
    for mode in MODES:
        assert runs[mode]["distributed_type"] == "DistributedType.NO" and runs[mode]["device"] == "cpu"
        assert runs[mode]["source_type"] == "DataLoaderShard"  # the source is accelerate's prepared loader
    check_exact_resumes(runs, steps_at_least=20)


@pytest.mark.xla
@pytest.mark.slow
def test_save_state_and_load_state_resume_both_loaders_exactly_on_xla(tmp_path):
    """On XLA the source stays a plain DataLoader (accelerate_runs.py says why) and the loop
    marks each step; the sifting math runs on the XLA device."""
    runs = accelerate_runs(tmp_path, {"PJRT_DEVICE": "CPU"})
    for mode in MODES:
        assert runs[mode]["distributed_type"] == "DistributedType.XLA" and runs[mode]["device"].startswith("xla")
        assert runs[mode]["backend"] == "XlaBackend", runs[mode]["backend"]
    check_exact_resumes(runs, steps_at_least=20)


def test_the_docs_example_resumes_to_the_uninterrupted_weights(tmp_path):
    """In a subprocess with USE_TORCH_XLA=0: accelerate would pick torch-xla's device in this one."""
    (tmp_path / "example.py").write_text(example("Resuming with accelerate"), encoding="utf-8")
    out = run_python([str(tmp_path / "example.py")], {"USE_TORCH_XLA": "0"}, cwd=tmp_path)
    assert "same weights: True" in out
    assert (tmp_path / "checkpoint" / "custom_checkpoint_0.pkl").is_file()  # the loader's state
