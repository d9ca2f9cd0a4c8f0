"""``enable_sifting`` with a real ``transformers.Trainer`` training a small BERT (built from a
config), and one mode enabled after the other.

The runs happen in subprocesses (``trainer_scenarios.py``), since transformers and
accelerate choose torch-xla at import when it is installed: the CPU runs set
``USE_TORCH_XLA=0`` (Hugging Face's switch), the XLA run trains on torch-xla's CPU device.
"""

import math

import pytest

from tests.neuron_sift.integrations.hf_trainer.trainer_harness import run_python, scenarios
from tests.neuron_sift.integrations.readme_examples import example

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cpu_runs():
    return scenarios("sifting", "cpu")


@pytest.fixture(scope="module")
def switch_runs():
    return scenarios("switch", "cpu")


def check_exact_run(r, epochs, grad_accumulation=1):
    """The Trainer ran exactly the steps it planned from the sifted loader's length."""
    assert r["loader_type"] == "ExactLengthLoader"
    assert r["len_loader"] == r["planned_per_epoch"]
    # Against what the sifted passes really emit (iterated, not planned): exact in fixed
    # mode, within a batch per epoch of a random count in probabilistic mode.
    if r["exact"]:
        assert r["len_loader"] == math.floor(r["counted_per_epoch"] + 0.5), r["counted_per_epoch"]
    else:
        assert abs(r["len_loader"] - r["counted_per_epoch"]) <= 1.5, r["counted_per_epoch"]
    updates_per_epoch = -(-r["len_loader"] // grad_accumulation)
    assert r["global_step"] == r["max_steps"] == epochs * updates_per_epoch
    assert r["state_epoch"] == pytest.approx(epochs)
    assert r["final_lr"] == 0.0  # the linear schedule ended exactly at its end
    c = r["counts"]
    assert c["num_batches_emitted"] == epochs * r["len_loader"]  # every emitted batch was trained on
    assert c["num_samples_emitted"] == c["num_batches_emitted"] * 8
    assert c["num_orig_samples_kept"] == c["num_samples_emitted"] + c["num_samples_pending"]
    assert r["trained"] and r["scored_by_trainer_model"] and r["loss_batch_types"] == ["dict"]
    assert r["source_type"] == "DataLoaderShard"  # the Trainer's own accelerate-prepared loader is the source


def test_fixed_mode_needs_no_max_steps(cpu_runs):
    r = cpu_runs["fixed_epochs"]
    assert r["args_max_steps"] == -1 and r["num_train_epochs"] == 3
    check_exact_run(r, epochs=3)
    c = r["counts"]
    # 96 samples, batches of 8, delay 2: passes of 7, 6, 6 batches planned, 6 per Trainer epoch;
    # the stream covers 3 passes to within 3 / 2 batches.
    assert c["num_source_batches_delayed"] == 2
    assert abs(c["num_source_batches"] - 3 * 12) <= 2 * 3
    assert r["passes"] == 3
    assert r["eval_loader_type"] == "DataLoaderShard"  # evaluation is not sifted
    assert r["n_examples"] == 96


def test_probabilistic_mode_runs_exactly_the_planned_steps(cpu_runs):
    r = cpu_runs["probabilistic_epochs"]
    check_exact_run(r, epochs=2)
    assert 0.4 < r["kept_share"] < 0.65


def test_set_epochs_int_sets_the_epochs_and_ignores_max_steps(cpu_runs):
    r = cpu_runs["set_epochs_int"]
    assert r["num_train_epochs"] == 2 and r["args_max_steps"] == -1
    check_exact_run(r, epochs=2)


def test_set_epochs_true_trains_num_train_epochs(cpu_runs):
    r = cpu_runs["set_epochs_true"]
    assert r["num_train_epochs"] == 2 and r["args_max_steps"] == -1
    check_exact_run(r, epochs=2)
    assert r["kept_share"] == 0.5  # fixed mode, beta 1, no delay


def test_max_steps_without_set_epochs_runs_across_passes(cpu_runs):
    r = cpu_runs["max_steps"]
    assert r["args_max_steps"] == 7
    assert r["global_step"] == r["max_steps"] == 7
    assert r["len_loader"] < 7 and r["passes"] >= 2  # the sifted stream continued into the next pass
    assert r["counts"]["num_batches_emitted"] == 7
    assert r["final_lr"] == 0.0


def test_gradient_accumulation_counts_optimizer_steps(cpu_runs):
    r = cpu_runs["grad_accumulation"]
    check_exact_run(r, epochs=2, grad_accumulation=2)
    assert r["logged"] == 0  # log_metrics=False


def test_sifting_metrics_reach_the_trainer_logs(cpu_runs):
    r = cpu_runs["fixed_epochs"]
    assert r["logged"] >= r["global_step"] // 2  # every logging step (2) and the final log
    for name in (
        "num_orig_samples_seen",
        "num_orig_samples_kept",
        "observed_kept_share",
        "loss_history_q50",
        "machinery_latency",
        "history_fill",
    ):
        assert "sifting/" + name in r["logged_keys"]
    assert r["final_logged_seen"] == r["counts"]["num_orig_samples_seen"]
    assert r["train_metrics_observed_kept_share"] == pytest.approx(r["kept_share"])
    assert "sifting/kept_share" not in r["logged_keys"]  # 0.5.0's alias is gone


def test_dataset_without_length_falls_back_to_max_steps(cpu_runs):
    r = cpu_runs["iterable_dataset"]
    assert r["loader_type"] == "SiftingDataloader"  # no length to plan with: the Trainer runs max_steps
    assert r["global_step"] == 6
    assert r["counts"]["num_batches_emitted"] == 6
    assert r["epoch"] >= 3  # 40 samples sift into 2 batches per pass (+ pending): passes repeat


def test_errors_at_the_call(cpu_runs):
    assert cpu_runs["errors"] == {
        "no_loss": "LossImplementationNotProvidedException",
        "bad_config": "SiftConfigValidationException",
        "bad_set_epochs": "ValueError",
        "not_a_trainer": "TypeError",
    }


def test_enabling_twice_replaces_the_settings(cpu_runs):
    r = cpu_runs["enabled_twice"]
    check_exact_run(r, epochs=1)
    assert r["kept_share"] == 0.5  # the second config (beta 1), not the first (beta 3)


def test_enabling_epoch_sifting_after_sifting_replaces_it(switch_runs):
    """The epoch mode's hooks replace the per-batch mode's: no per-batch loader is built, its
    loss never runs, and only the epoch mode's scalars are logged."""
    r = switch_runs["sifting_then_epoch"]
    assert r["mode"] == "epoch_sifting" and not r["per_batch_loader"] and r["per_batch_loss_calls"] == 0
    assert r["loader_type"] == "ExactLengthLoader" and r["logged"] and not r["sifting_logged"]
    assert r["global_step"] == r["planned"] and r["unpaired"] == 0


def test_enabling_sifting_after_epoch_sifting_replaces_it(switch_runs):
    """The per-batch mode's hooks replace the epoch mode's: the Trainer's own compute_loss is
    back, train and the skip are the per-batch mode's, one saving callback is left (the
    per-batch mode's), and only per-batch scalars are logged."""
    r = switch_runs["epoch_then_sifting"]
    assert r["mode"] == "sifting" and not r["epoch_loader"]
    assert r["own_methods"] and r["epoch_hooks_gone"] and r["callbacks_added"] == 1 and r["attributes_back"]
    assert r["loader_type"] == "ExactLengthLoader" and r["logged"] > 0 and not r["epoch_sifting_logged"]
    assert r["global_step"] == r["max_steps"] and r["counts"]["num_batches_emitted"] == r["global_step"]
    assert r["scored_by_trainer_model"] and r["kept_share"] == 0.5


def test_enabling_epoch_sifting_twice_replaces_the_settings(switch_runs):
    r = switch_runs["epoch_twice"]
    assert r["callbacks_added"] == 1  # one saving callback, not two
    assert r["kept"][1] == 48  # the second config (kept share 0.5 of 96), not the first (0.25)
    assert r["global_step"] == r["planned"] and r["unpaired"] == 0


def test_readme_hugging_face_trainer_example(tmp_path):
    script = tmp_path / "hf_example.py"
    script.write_text(example("A complete example"), encoding="utf-8")
    out = run_python([str(script)], {"USE_TORCH_XLA": "0"}, cwd=tmp_path)
    steps = next(line for line in out.splitlines() if line.startswith("optimizer steps:")).split()
    assert steps[2] == steps[4] and int(steps[2]) > 0  # "optimizer steps: N of N"
    seen_kept = next(line for line in out.splitlines() if line.startswith("samples seen:")).split()
    assert 0 < int(seen_kept[4]) < int(seen_kept[2])
    share = float(next(line for line in out.splitlines() if line.startswith("logged kept share:")).split()[-1])
    assert share == pytest.approx(int(seen_kept[4]) / int(seen_kept[2]))


@pytest.fixture(scope="module")
def xla_runs():
    return scenarios("sifting", "xla")


@pytest.mark.xla
def test_trainer_on_xla_sifts_the_accelerate_device_loader(xla_runs):
    """On XLA accelerate wraps the train loader in MpDeviceLoader; sifting takes it as its source."""
    r = xla_runs["xla_fixed"]
    assert r["backend"] == "xla" and r["source_type"] == "MpDeviceLoaderWrapper"
    assert r["loader_type"] == "ExactLengthLoader"
    assert r["global_step"] == r["max_steps"] == r["len_loader"] == r["planned_per_epoch"] == 4
    assert r["counts"]["num_orig_samples_seen"] == 64 and r["counts"]["num_orig_samples_kept"] == 32
    assert r["trained"] and r["scored_by_trainer_model"]
    assert isinstance(r["compile_count"], int) and r["compile_count"] == r["compile_time_samples"] > 0
    assert "sifting/compile_count" in r["logged_keys"]


@pytest.mark.xla
def test_the_fused_adamw_default_on_xla_is_refused_at_the_call_naming_the_setting(xla_runs):
    """transformers 4.54+ with torch 2.8+ defaults to optim="adamw_torch_fused", whose first step
    fails on XLA (torch's own refusal, observed below): both modes say so at the call instead,
    naming optim="adamw_torch"; a Trainer given its own optimizer is let through."""
    r = xla_runs["xla_fused_default"]
    assert r["device"].startswith("xla")
    assert "fused=True" in r["torch_refuses"] and "xla" in r["torch_refuses"]
    for mode, caller in (("sifting", "enable_sifting"), ("epoch", "enable_epoch_sifting")):
        message = r["refused"][mode]
        assert message is not None and message.startswith(caller + ":"), message
        assert "optim='adamw_torch_fused'" in message and 'optim="adamw_torch"' in message
        assert "optimizers=(optimizer, scheduler)" in message
    assert r["own_optimizer_mode"] == "sifting"
