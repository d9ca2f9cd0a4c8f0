"""Hugging Face Trainer runs with ``enable_sifting``, executed in a subprocess by test_trainer.py.

A subprocess, because transformers and accelerate decide once per process, at import,
whether to train on torch-xla (installed in CI, and started by tests/conftest.py): CPU
runs set ``USE_TORCH_XLA=0``, Hugging Face's switch, the XLA run leaves it on. Prints
one JSON object: scenario name -> observations.

    python -m tests.neuron_sift.integrations.trainer_scenarios cpu|xla
"""

import json
import math
import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from neuron_sift import Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.exceptions import LossImplementationNotProvidedException, SiftConfigValidationException
from neuron_sift.integrations.schedules import ExactLengthLoader, planned_steps
from neuron_sift.integrations.trainer import TrainerSource, enable_sifting

BATCH = 8


class ToyTextDataset(Dataset):
    def __init__(self, n=96, seq_len=16):
        g = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(5, 100, (n, seq_len), generator=g)
        self.labels = (self.input_ids[:, 0] > 50).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ids = self.input_ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


class SiftBertLoss(Loss):
    def __init__(self):
        self.celoss = torch.nn.CrossEntropyLoss(reduction="none")
        self.calls = 0
        self.models = set()
        self.batch_types = set()

    def loss(self, model, transformed_batch, original_batch=None):
        self.calls += 1
        self.models.add(id(model))
        self.batch_types.add(type(original_batch).__name__)
        inputs = {k: v for k, v in original_batch.items() if k != "labels"}
        logits = ModelOutput(model(**inputs)).logits
        return self.celoss(logits, original_batch["labels"])


def bert():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def sift_config(mode, delay=2, beta=1.0):
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": delay}},
        selection_mode=mode,
        seed=0,
    )


class TinyTextClassifier(torch.nn.Module):
    """Mean of token embeddings and a linear head: a Trainer-compatible model that compiles fast on XLA."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.embed(input_ids).mean(dim=1))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits, labels)
        return out


class ModelOutput(dict):
    """Attribute access (``.logits``) for the plain dict of TinyTextClassifier."""

    __getattr__ = dict.__getitem__


def make_trainer(out, n=96, xla=False, model=None, **kwargs):
    args = dict(
        output_dir=out,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    if xla:
        args["optim"] = "adamw_torch"  # transformers' default fused AdamW does not take XLA tensors
    else:
        args["use_cpu"] = True
    args.update(kwargs)
    model = bert() if model is None else model
    return Trainer(model=model, args=TrainingArguments(**args), train_dataset=ToyTextDataset(n))


def planned_per_epoch(trainer, cfg, passes):
    """What the Trainer's epochs should hold: planned batches of `passes` passes / passes, rounded."""
    source = TrainerSource(trainer._neuron_sift_originals["get_train_dataloader"]())
    probe = SiftingDataloader(sift_config=cfg, orig_dataloader=source, loss_impl=SiftBertLoss(), model=trainer.model)
    return max(1, math.floor(planned_steps(probe, passes) / passes + 0.5))


def counted_per_epoch(trainer, cfg, passes):
    """Batches a sifted loader over the Trainer's own source really emits in `passes` passes,
    per pass: counted by iterating it, not planned (run before training: same weights)."""
    source = TrainerSource(trainer._neuron_sift_originals["get_train_dataloader"]())
    probe = SiftingDataloader(sift_config=cfg, orig_dataloader=source, loss_impl=SiftBertLoss(), model=trainer.model)
    return sum(1 for _ in range(passes) for _ in probe) / passes


def observe(trainer, loss, cfg=None, passes=None):
    before = [p.detach().clone().cpu() for p in trainer.model.parameters()]
    counted = counted_per_epoch(trainer, cfg, passes) if cfg is not None else None
    out = trainer.train()
    sifting = trainer.sifting_dataloader
    c = sifting.counts
    logs = [e for e in trainer.state.log_history if "sifting/kept_share" in e]
    result = {
        "global_step": trainer.state.global_step,
        "max_steps": trainer.state.max_steps,
        "state_epoch": trainer.state.epoch,
        "num_train_epochs": trainer.args.num_train_epochs,
        "args_max_steps": trainer.args.max_steps,
        "final_lr": trainer.lr_scheduler.get_last_lr()[0],
        "trained": any(not torch.equal(a, b.detach().cpu()) for a, b in zip(before, trainer.model.parameters())),
        "counts": c.as_dict(),
        "len_loader": len(trainer.callback_handler.train_dataloader),
        "loader_type": type(trainer.callback_handler.train_dataloader).__name__,
        "source_type": type(sifting.orig_dataloader.prepared).__name__,
        "backend": sifting.backend.name,
        "scored_by_trainer_model": loss.models == {id(trainer.model)},
        "loss_calls": loss.calls,
        "loss_batch_types": sorted(loss.batch_types),
        "passes": trainer.callback_handler.train_dataloader.passes,
        "logged": len(logs),
        "logged_keys": sorted(logs[-1]) if logs else [],
        "final_logged_seen": logs[-1]["sifting/num_orig_samples_seen"] if logs else None,
        "train_metrics_kept_share": out.metrics.get("sifting/kept_share"),
        "kept_share": c.num_orig_samples_kept / c.num_orig_samples_seen,
    }
    if cfg is not None:
        result["planned_per_epoch"] = planned_per_epoch(trainer, cfg, passes)
        result["counted_per_epoch"] = counted
        result["exact"] = sifting.length_is_exact
    return result


def cpu_scenarios(out):
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


def xla_scenarios(out):
    cfg = sift_config("fixed", delay=0)
    trainer = make_trainer(out, n=64, xla=True, model=TinyTextClassifier(), num_train_epochs=1, logging_steps=4)
    loss = SiftBertLoss()
    enable_sifting(trainer, cfg, loss)
    result = observe(trainer, loss, cfg, passes=1)
    import torch_xla.debug.metrics as met

    from neuron_sift.metrics import collect_metrics

    result["compile_count"] = collect_metrics(trainer).compile_count
    result["compile_time_samples"] = met.metric_data("CompileTime")[0]  # the same count, read directly
    return {"xla_fixed": result}


def main():
    which = sys.argv[1]
    with tempfile.TemporaryDirectory() as out:
        results = cpu_scenarios(out) if which == "cpu" else xla_scenarios(out)
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
