"""Hugging Face Trainer runs of both sifting modes, executed in a subprocess by
test_per_batch.py and test_epoch_mode.py (see ``trainer_harness.py`` for why). Prints one
JSON object: scenario name -> observations.

    python -m tests.neuron_sift.integrations.hf_trainer.trainer_scenarios sifting|epoch|switch cpu|xla|resume|lengths
"""

import os
import sys
import tempfile

import torch

from neuron_sift.exceptions import LossImplementationNotProvidedException, SiftConfigValidationException
from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting
from neuron_sift.integrations.hf_trainer.patch import installed_mode
from neuron_sift.integrations.schedules import ExactLengthLoader
from neuron_sift.integrations.trainer import enable_sifting
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import (
    SiftBertLoss,
    TinyTextClassifier,
    ToyTextDataset,
    TrainedIds,
    bert,
    compiles_per_epoch,
    gpt,
    make_trainer,
    observe,
    observe_epoch,
    save_at,
    sift_config,
)

EPOCH_CONFIG = {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.25, "start_rank_correlation": None}  # exact lengths

# -- per-batch sifting (enable_sifting) ------------------------------------------------------


def sifting_cpu(out):
    results = {}

    # Fixed mode, no max_steps, no set_epochs: the known length plans the run.
    cfg = sift_config("fixed", delay=2)
    trainer = make_trainer(out, num_train_epochs=3)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss)
    results["fixed_epochs"] = observe(trainer, loss, cfg, passes=3)
    eval_loader = trainer.get_eval_dataloader(ToyTextDataset(16))
    results["fixed_epochs"]["eval_loader_type"] = type(eval_loader).__name__
    results["fixed_epochs"]["n_examples"] = trainer.num_examples(trainer.get_train_dataloader())

    # Probabilistic mode, epochs: still exactly the planned steps.
    cfg = sift_config("probabilistic", delay=0)
    trainer = make_trainer(out, num_train_epochs=2)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss)
    results["probabilistic_epochs"] = observe(trainer, loss, cfg, passes=2)

    # set_epochs=2 overrides max_steps and num_train_epochs.
    cfg = sift_config("probabilistic", delay=0)
    trainer = make_trainer(out, num_train_epochs=1, max_steps=3)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss, set_epochs=2)
    results["set_epochs_int"] = observe(trainer, loss, cfg, passes=2)

    # set_epochs=True: num_train_epochs from the arguments, max_steps ignored.
    cfg = sift_config("fixed", delay=0)
    trainer = make_trainer(out, num_train_epochs=2, max_steps=3)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss, set_epochs=True)
    results["set_epochs_true"] = observe(trainer, loss, cfg, passes=2)

    # max_steps and no set_epochs: the Trainer runs max_steps steps over as many passes as needed.
    cfg = sift_config("probabilistic", delay=0, beta=2.0)
    trainer = make_trainer(out, num_train_epochs=1, max_steps=7)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss)
    results["max_steps"] = observe(trainer, loss)

    # Gradient accumulation: max_steps counts optimizer steps.
    cfg = sift_config("fixed", delay=0)
    trainer = make_trainer(out, num_train_epochs=2, gradient_accumulation_steps=2)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss, log_metrics=False)
    results["grad_accumulation"] = observe(trainer, loss, cfg, passes=2)

    # A dataset without a length: as in smart_sifting, the Trainer then needs max_steps.
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(ToyTextDataset(40)[i] for i in range(40))

    trainer = make_trainer(out, max_steps=6)
    trainer.train_dataset = Stream()
    loss = SiftBertLoss()
    enable_sifting(trainer, sift_config("fixed", delay=0), loss)
    trainer.train()
    c = trainer.sifting_dataloader.counts
    results["iterable_dataset"] = {
        "global_step": trainer.state.global_step,
        "loader_type": type(trainer.callback_handler.train_dataloader).__name__,
        "counts": c.as_dict(),
        "epoch": trainer.sifting_dataloader.epoch,
    }

    # Errors at the call, not at the first step.
    trainer = make_trainer(out, num_train_epochs=1)
    errors = {}
    for name, call in {
        "no_loss": lambda: enable_sifting(trainer, sift_config("fixed"), object()),
        "bad_config": lambda: enable_sifting(trainer, {"beta_value": -1, "loss_history_length": 8}, SiftBertLoss()),
        "bad_set_epochs": lambda: enable_sifting(trainer, sift_config("fixed"), SiftBertLoss(), set_epochs=0),
        "not_a_trainer": lambda: enable_sifting(object(), sift_config("fixed"), SiftBertLoss()),
    }.items():
        try:
            call()
            errors[name] = None
        except (LossImplementationNotProvidedException, SiftConfigValidationException, ValueError, TypeError) as e:
            errors[name] = type(e).__name__
    results["errors"] = errors

    # Enabling twice replaces the settings instead of sifting twice.
    cfg = sift_config("fixed", delay=0)
    trainer = make_trainer(out, num_train_epochs=1)
    enable_sifting(trainer, sift_config("fixed", beta=3.0, delay=0), SiftBertLoss())
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss)
    results["enabled_twice"] = observe(trainer, loss, cfg, passes=1)
    assert isinstance(trainer.callback_handler.train_dataloader, ExactLengthLoader)
    return results


def sifting_xla(out):
    cfg = sift_config("fixed", delay=0)
    trainer = make_trainer(out, n=64, xla=True, model=TinyTextClassifier(), num_train_epochs=1, logging_steps=4)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss)
    result = observe(trainer, loss, cfg, passes=1)
    import torch_xla.debug.metrics as met

    from neuron_sift.metrics import collect_metrics

    result["compile_count"] = collect_metrics(trainer).compile_count
    result["compile_time_samples"] = met.metric_data("CompileTime")[0]  # the same count, read directly
    return {"xla_fixed": result, "xla_fused_default": fused_default_on_xla(out)}


def fused_default_on_xla(out):
    """The Trainer on XLA with optim="adamw_torch_fused" (transformers' default from 4.54 with
    torch 2.8+): what each mode says at the call, whether a Trainer given its own optimizer is
    let through, and whether torch's fused AdamW itself takes the Trainer's XLA parameters."""

    def trainer():
        return make_trainer(
            out, n=16, xla=True, model=TinyTextClassifier(), num_train_epochs=1, optim="adamw_torch_fused"
        )

    enables = {
        "sifting": lambda t: enable_sifting(t, sift_config("fixed", delay=0), SiftBertLoss()),
        "epoch": lambda t: enable_epoch_sifting(t, EPOCH_CONFIG),
    }
    refused = {}
    for name, enable in enables.items():
        try:
            enable(trainer())
            refused[name] = None
        except ValueError as exc:
            refused[name] = str(exc)
    own = trainer()
    own.optimizer = torch.optim.AdamW(own.model.parameters())  # as Trainer(optimizers=(optimizer, None)) sets it
    enables["sifting"](own)
    params = list(trainer().model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    try:
        torch.optim.AdamW(params, fused=True).step()
        torch_refuses = None
    except RuntimeError as exc:
        torch_refuses = str(exc)
    return {
        "device": str(own.args.device),
        "refused": refused,
        "own_optimizer_mode": installed_mode(own),
        "torch_refuses": torch_refuses,
    }


# -- epoch-level sifting (enable_epoch_sifting) ---------------------------------------------


def epoch_run(model, data, out, epochs=4, accumulate=1, share=0.5, table="replicated"):
    trainer = make_trainer(
        out,
        model=model,
        data=data,
        eval_data=data,
        num_train_epochs=epochs,
        gradient_accumulation_steps=accumulate,
        lr_scheduler_type="linear",
        seed=42,
    )
    enable_epoch_sifting(trainer, {**EPOCH_CONFIG, "kept_share": share, "score_table": table})
    result = trainer.train()
    r = observe_epoch(trainer)
    lrs = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    r.update(last_lr=lrs[-1] if lrs else None, eval_loss=trainer.evaluate().get("eval_loss"))
    r["train_loss"] = result.training_loss
    return r


def epoch_cpu(out):
    classifier, lm = bert(), gpt()
    return {
        "classification": epoch_run(classifier, ToyTextDataset(), out),
        "causal_lm": epoch_run(lm, ToyTextDataset(lm=True), out, accumulate=2),
        "classification_sharded": epoch_run(bert(), ToyTextDataset(), out, table="sharded"),
    }


def epoch_xla(out, epochs=5):
    """A model that compiles fast, on the device accelerate picks wherever torch-xla is installed."""
    box, compiles = [], []
    trainer = make_trainer(
        out, n=64, xla=True, model=TinyTextClassifier(), num_train_epochs=epochs, logging_steps=4, seed=42,
        callbacks=[compiles_per_epoch(box, compiles)],
    )  # fmt: skip
    box.append(trainer)
    enable_epoch_sifting(
        trainer, {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.2, "start_rank_correlation": None}
    )
    trainer.train()
    return {"xla": {**observe_epoch(trainer), "compiles": compiles}}


def resume_trainer(out, data, trained, save=()):
    trainer = make_trainer(
        out, model=TinyTextClassifier(), data=data, num_train_epochs=4, learning_rate=1e-2, logging_steps=500,
        callbacks=[save_at(save)],
    )  # fmt: skip
    return enable_epoch_sifting(trainer, EPOCH_CONFIG, trained)


def epoch_resume(out):
    """An uninterrupted run saving at the end of Trainer epoch 2 (step 12 of 24) and mid-epoch
    (step 9); runs resumed from each, and from each state as 0.4.0's EpochStream wrote it
    (test_checkpoint.py compares the runs of both modes at length; this is the epoch
    mode's older layout)."""
    data = ToyTextDataset(n=64)
    full = TrainedIds(data)
    trainer = resume_trainer(out, data, full, save=(9, 12))
    trainer.train()
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    resumed = TrainedIds(data)
    again = resume_trainer(out, data, resumed)
    again.train(resume_from_checkpoint=f"{out}/checkpoint-12")
    m = again.epoch_sifting_dataloader.metrics()
    saved = torch.load(f"{out}/checkpoint-12/epoch_sifting_rank0.pt", weights_only=True)
    result = {
        "per_epoch": len(trainer.epoch_sifting_stream),
        "full_steps": full.steps,
        "resumed_steps": resumed.steps,
        "global_step": again.state.global_step,
        "saved": sorted(f for f in os.listdir(f"{out}/checkpoint-12") if f.startswith("epoch_sifting")),
        "saved_kind": saved["kind"],
        "same_weights": all(torch.allclose(a, b) for a, b in zip(weights, again.model.parameters())),
        "kinds": [e["kind"] for e in m["epochs"]],
        "unpaired": m["unpaired_batches"],
    }
    mid_epoch = TrainedIds(data)
    resume_trainer(out, data, mid_epoch).train(resume_from_checkpoint=f"{out}/checkpoint-9")
    result["mid_epoch"] = mid_epoch.steps
    for step in (12, 9):
        # The checkpoint as 0.4.0 wrote it: EpochStream's keys, no kind, no version.
        path = f"{out}/checkpoint-{step}/epoch_sifting_rank0.pt"
        saved = torch.load(path, weights_only=True)
        old = {"loader": saved["loader"], "per_epoch": saved["steps_per_epoch"], "in_epoch": saved["epoch_yielded"]}
        torch.save(old, path)
        from_old = TrainedIds(data)
        resume_trainer(out, data, from_old).train(resume_from_checkpoint=f"{out}/checkpoint-{step}")
        result[f"resumed_from_0_4_0_at_{step}"] = from_old.steps
    return {"resume": result}


def epoch_lengths(out):
    """The run's length against the plan (64 samples, batch 8, kept share 0.5, 4 epochs: plans
    of 8, 4, 4 and 8 batches, 24 optimizer steps): max_steps inside the plan stops there,
    max_steps equal to the plan is the plan, max_steps beyond it and a fractional
    num_train_epochs are refused before any step."""
    import logging

    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("neuron_sift.integrations.epoch_trainer").addHandler(handler)

    def run(**arguments):
        warnings.clear()
        data = ToyTextDataset(n=64)
        trainer = make_trainer(out, model=TinyTextClassifier(), data=data, logging_steps=500, **arguments)
        enable_epoch_sifting(trainer, EPOCH_CONFIG, TrainedIds(data))
        try:
            trainer.train()
        except ValueError as e:
            return {"refused": str(e), "global_step": trainer.state.global_step}
        kinds = [e["kind"] for e in trainer.epoch_sifting_dataloader.metrics()["epochs"]]
        return {"global_step": trainer.state.global_step, "kinds": kinds, "warnings": list(warnings)}

    results = {
        "within": run(num_train_epochs=4, max_steps=10),
        "whole_plan": run(num_train_epochs=4, max_steps=24),
        "beyond": run(num_train_epochs=4, max_steps=30),
        "beyond_with_accumulation": run(num_train_epochs=4, max_steps=13, gradient_accumulation_steps=2),
    }
    try:
        trainer = make_trainer(out, model=TinyTextClassifier(), data=ToyTextDataset(n=64), num_train_epochs=2.5)
        enable_epoch_sifting(trainer, EPOCH_CONFIG)
        results["fractional"] = None
    except ValueError as e:
        results["fractional"] = str(e)
    return {"lengths": results}


# -- one mode after the other: the later one replaces the earlier -----------------------------


def switch_cpu(out):
    results = {}
    loss = SiftBertLoss()
    trainer = make_trainer(out, model=TinyTextClassifier(), num_train_epochs=2)
    enable_sifting(trainer, sift_config("fixed", delay=0), loss)
    enable_epoch_sifting(trainer, EPOCH_CONFIG)
    trainer.train()
    results["sifting_then_epoch"] = {
        **observe_epoch(trainer),
        "mode": installed_mode(trainer),
        "per_batch_loader": getattr(trainer, "sifting_dataloader", None) is not None,
        "per_batch_loss_calls": loss.calls,
    }
    trainer = make_trainer(out, model=TinyTextClassifier(), num_train_epochs=2)
    # hooked by both modes (checkpoints); transformers 4.x has no get_resumed_dataloader
    both = [name for name in ("train", "get_resumed_dataloader") if hasattr(trainer, name)]
    own_compute_loss = trainer.compute_loss
    accepts_loss_kwargs = trainer.model_accepts_loss_kwargs
    callbacks = len(trainer.callback_handler.callbacks)
    enable_epoch_sifting(trainer, EPOCH_CONFIG)
    epoch_hooks = {name: getattr(trainer, name) for name in both}
    enable_sifting(trainer, sift_config("fixed", delay=0), loss := SiftBertLoss())
    r = observe(trainer, loss)
    r.update(
        mode=installed_mode(trainer),
        epoch_loader=getattr(trainer, "epoch_sifting_dataloader", None) is not None,
        # the Trainer's own compute_loss is back (bound methods compare equal by function and instance)
        own_methods=trainer.compute_loss == own_compute_loss,
        epoch_hooks_gone=all(getattr(trainer, name) is not hook for name, hook in epoch_hooks.items()),
        callbacks_added=len(trainer.callback_handler.callbacks) - callbacks,
        attributes_back=trainer.model_accepts_loss_kwargs == accepts_loss_kwargs,
    )
    results["epoch_then_sifting"] = r
    trainer = make_trainer(out, model=TinyTextClassifier(), num_train_epochs=4)
    enable_epoch_sifting(trainer, {**EPOCH_CONFIG, "kept_share": 0.25})
    enable_epoch_sifting(trainer, EPOCH_CONFIG)
    trainer.train()
    results["epoch_twice"] = {
        **observe_epoch(trainer),
        "callbacks_added": len(trainer.callback_handler.callbacks) - callbacks,
    }
    return results


SCENARIOS = {
    ("sifting", "cpu"): sifting_cpu,
    ("sifting", "xla"): sifting_xla,
    ("epoch", "cpu"): epoch_cpu,
    ("epoch", "xla"): epoch_xla,
    ("epoch", "resume"): epoch_resume,
    ("epoch", "lengths"): epoch_lengths,
    ("switch", "cpu"): switch_cpu,
}


def main():
    import json

    mode, which = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as out:
        results = SCENARIOS[mode, which](out)
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
