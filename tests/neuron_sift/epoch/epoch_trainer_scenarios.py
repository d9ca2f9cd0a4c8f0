"""Hugging Face Trainer runs with ``enable_epoch_sifting``, in a subprocess: ``cpu`` with
USE_TORCH_XLA=0, ``xla`` on torch-xla's CPU device (see
tests/neuron_sift/integrations/trainer_scenarios.py). Prints one JSON object.

    python -m tests.neuron_sift.epoch.epoch_trainer_scenarios cpu|xla
"""

import json
import os
import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting
from neuron_sift.shared.sources import unwrap
from tests.neuron_sift.integrations.trainer_scenarios import TinyTextClassifier


class Toy(Dataset):
    def __init__(self, n=96, seq_len=16, lm=False):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, seq_len), generator=g)
        self.labels = self.ids.clone() if lm else (self.ids[:, 0] > 50).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def run(model, data, out, epochs=4, accumulate=1, share=0.5):
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=8,
        num_train_epochs=epochs,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        logging_steps=2,
        report_to=[],
        save_strategy="no",
        gradient_accumulation_steps=accumulate,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    enable_epoch_sifting(trainer, {"seed": 0, "kept_share": share, "anneal_fraction": 0.25})
    result = trainer.train()
    loader = trainer.epoch_sifting_dataloader
    m = loader.metrics()
    ev = trainer.evaluate()
    lrs = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    return {
        "global_step": trainer.state.global_step,
        "planned": loader.counts["batches_recorded"],
        "planned_steps_at_start": None,
        "scores_recorded": m["scores_recorded"],
        "kinds": [e["kind"] for e in m["epochs"]],
        "kept": [e["kept"] for e in m["epochs"]],
        "unpaired": m["unpaired_batches"],
        "last_lr": lrs[-1] if lrs else None,
        "logged": sorted(k for h in trainer.state.log_history for k in h if k.startswith("epoch_sifting/"))[:3],
        "eval_loss": ev.get("eval_loss"),
        "train_loss": result.training_loss,
        "source": unwrap(loader.orig_dataloader).describe(),
        "rebuilt": unwrap(loader._loader).describe(),
    }


class CompilesPerEpoch(TrainerCallback):
    """XLA compilations so far at the end of each Trainer epoch."""

    def __init__(self):
        self.trainer = None
        self.counts = []

    def on_epoch_end(self, args, state, control, **kwargs):
        self.counts.append(self.trainer.epoch_sifting_dataloader.backend.compile_count())


def run_xla(out, epochs=5):
    """A model that compiles fast, on the device accelerate picks wherever torch-xla is installed."""
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=8,
        num_train_epochs=epochs,
        learning_rate=1e-3,
        optim="adamw_torch",  # transformers' default fused AdamW does not take XLA tensors
        logging_steps=4,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    compiles = CompilesPerEpoch()
    trainer = Trainer(model=TinyTextClassifier(), args=args, train_dataset=Toy(n=64), callbacks=[compiles])
    compiles.trainer = trainer
    enable_epoch_sifting(trainer, {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.2})
    trainer.train()
    loader = trainer.epoch_sifting_dataloader
    m = loader.metrics()
    return {
        "global_step": trainer.state.global_step,
        "planned": loader.counts["batches_recorded"],
        "scores_recorded": m["scores_recorded"],
        "unpaired": m["unpaired_batches"],
        "kinds": [e["kind"] for e in m["epochs"]],
        "backend": loader.backend.name,
        "compiles": compiles.counts,
        "source": unwrap(loader.orig_dataloader).describe(),
        "rebuilt": unwrap(loader._loader).describe(),
    }


class SaveAt(TrainerCallback):
    """Checkpoints at the given global steps only."""

    def __init__(self, steps):
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = state.global_step in self.steps


class TrainedIds:
    """The classification loss, recording the dataset index of every sample trained on."""

    def __init__(self, data):
        self.index = {tuple(row.tolist()): i for i, row in enumerate(data.ids)}
        self.steps = []

    def __call__(self, outputs, inputs):
        self.steps.append([self.index[tuple(row.tolist())] for row in inputs["input_ids"].cpu()])
        return torch.nn.functional.cross_entropy(outputs["logits"], inputs["labels"], reduction="none")


def resume_trainer(out, data, trained, save_at=()):
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=8,
        num_train_epochs=4,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=TinyTextClassifier(), args=args, train_dataset=data, callbacks=[SaveAt(save_at)])
    return enable_epoch_sifting(trainer, {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.25}, trained)


def run_resume(out):
    """An uninterrupted run saving at the end of Trainer epoch 2 (step 12 of 24) and mid-epoch
    (step 9); runs resumed from each."""
    data = Toy(n=64)
    full = TrainedIds(data)
    trainer = resume_trainer(out, data, full, save_at=(9, 12))
    trainer.train()
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    resumed = TrainedIds(data)
    again = resume_trainer(out, data, resumed)
    again.train(resume_from_checkpoint=f"{out}/checkpoint-12")
    m = again.epoch_sifting_dataloader.metrics()
    result = {
        "per_epoch": len(trainer.epoch_sifting_stream),
        "full_steps": full.steps,
        "resumed_steps": resumed.steps,
        "global_step": again.state.global_step,
        "saved": sorted(f for f in os.listdir(f"{out}/checkpoint-12") if f.startswith("epoch_sifting")),
        "same_weights": all(torch.allclose(a, b) for a, b in zip(weights, again.model.parameters())),
        "kinds": [e["kind"] for e in m["epochs"]],
        "unpaired": m["unpaired_batches"],
    }
    try:
        resume_trainer(out, data, TrainedIds(data)).train(resume_from_checkpoint=f"{out}/checkpoint-9")
        result["mid_epoch"] = None
    except ValueError as e:
        result["mid_epoch"] = str(e)
    return result


def main():
    torch.manual_seed(0)
    bert = BertForSequenceClassification(
        BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            num_labels=2,
        )
    )
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    out = {}
    with tempfile.TemporaryDirectory() as d:
        if sys.argv[1:] == ["xla"]:
            out["xla"] = run_xla(d)
        elif sys.argv[1:] == ["resume"]:
            out["resume"] = run_resume(d)
        else:
            out["classification"] = run(bert, Toy(), d)
            out["causal_lm"] = run(gpt, Toy(lm=True), d, accumulate=2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
