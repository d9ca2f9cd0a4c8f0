"""The parts of the Hugging Face Trainer scenarios of both modes (``trainer_scenarios.py``):
data, models, losses, configs, the Trainer, what a run is observed by, and the runner
that executes a scenario set in a subprocess.

A subprocess, because transformers and accelerate decide once per process, at import,
whether to train on torch-xla (installed in CI, and started by tests/conftest.py): CPU
runs set ``USE_TORCH_XLA=0``, Hugging Face's switch, the XLA runs leave it on.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset

from neuron_sift import Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations.hf_trainer.patch import original
from neuron_sift.integrations.schedules import planned_steps
from neuron_sift.integrations.trainer import TrainerSource

ROOT = Path(__file__).resolve().parents[4]
BATCH = 8


def run_python(args, env_extra, cwd=ROOT, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env_extra)
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-8000:]}"
    )
    return done.stdout


def scenarios(mode, which):
    """Run the scenario set ``which`` (cpu, xla, resume) of ``mode`` (sifting, epoch, switch)."""
    env = {"USE_TORCH_XLA": "1" if which == "xla" else "0", "PJRT_DEVICE": "CPU"}
    out = run_python(["-m", "tests.neuron_sift.integrations.hf_trainer.trainer_scenarios", mode, which], env)
    (line,) = [x for x in out.splitlines() if x.startswith("RESULTS ")]
    return json.loads(line[len("RESULTS ") :])


class ToyTextDataset(Dataset):
    """Token ids with a label from the first token (classification) or the ids themselves (causal LM)."""

    def __init__(self, n=96, seq_len=16, lm=False):
        g = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(5, 100, (n, seq_len), generator=g)
        self.labels = self.input_ids.clone() if lm else (self.input_ids[:, 0] > 50).long()

    @property
    def ids(self):
        return self.input_ids

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ids = self.input_ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


class ModelOutput(dict):
    """Attribute access (``.logits``) for the plain dict of TinyTextClassifier."""

    __getattr__ = dict.__getitem__


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
    from transformers import BertConfig, BertForSequenceClassification

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


def gpt():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2))


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


def sift_config(mode, delay=2, beta=1.0):
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": delay}},
        selection_mode=mode,
        seed=0,
    )


def make_trainer(out, n=96, xla=False, model=None, data=None, callbacks=None, eval_data=None, **kwargs):
    from transformers import Trainer, TrainingArguments

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
    data = ToyTextDataset(n) if data is None else data
    return Trainer(
        model=model, args=TrainingArguments(**args), train_dataset=data, eval_dataset=eval_data, callbacks=callbacks
    )


def probe(trainer, cfg):
    """A sifted loader over the Trainer's own source (its unpatched train loader)."""
    source = TrainerSource(original(trainer, "get_train_dataloader")())
    return SiftingDataloader(sift_config=cfg, orig_dataloader=source, loss_impl=SiftBertLoss(), model=trainer.model)


def planned_per_epoch(trainer, cfg, passes):
    """What the Trainer's epochs should hold: planned batches of `passes` passes / passes, rounded."""
    return max(1, math.floor(planned_steps(probe(trainer, cfg), passes) / passes + 0.5))


def counted_per_epoch(trainer, cfg, passes):
    """Batches a sifted loader over the Trainer's own source really emits in `passes` passes,
    per pass: counted by iterating it, not planned (run before training: same weights)."""
    loader = probe(trainer, cfg)
    return sum(1 for _ in range(passes) for _ in loader) / passes


def observe(trainer, loss, cfg=None, passes=None):
    """A per-batch run: train, then what the Trainer, the loader and the logs say."""
    before = [p.detach().clone().cpu() for p in trainer.model.parameters()]
    counted = counted_per_epoch(trainer, cfg, passes) if cfg is not None else None
    out = trainer.train()
    sifting = trainer.sifting_dataloader
    c = sifting.counts
    logs = [e for e in trainer.state.log_history if "sifting/observed_kept_share" in e]
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
        "train_metrics_observed_kept_share": out.metrics.get("sifting/observed_kept_share"),
        "kept_share": c.num_orig_samples_kept / c.num_orig_samples_seen,
        "epoch_sifting_logged": any(k.startswith("epoch_sifting/") for h in trainer.state.log_history for k in h),
    }
    if cfg is not None:
        result["planned_per_epoch"] = planned_per_epoch(trainer, cfg, passes)
        result["counted_per_epoch"] = counted
        result["exact"] = sifting.length_is_exact
    return result


def observe_epoch(trainer):
    """An epoch-sifting run, after training: what the loader and the Trainer say."""
    from neuron_sift.shared.sources import unwrap

    loader = trainer.epoch_sifting_dataloader
    m = loader.metrics()
    return {
        "global_step": trainer.state.global_step,
        "planned": loader.counts["batches_recorded"],
        "scores_recorded": m["scores_recorded"],
        "kinds": [e["kind"] for e in m["epochs"]],
        "kept": [e["kept"] for e in m["epochs"]],
        "unpaired": m["unpaired_batches"],
        "backend": loader.backend.name,
        "loader_type": type(trainer.callback_handler.train_dataloader).__name__,
        "logged": sorted(k for h in trainer.state.log_history for k in h if k.startswith("epoch_sifting/"))[:3],
        "sifting_logged": any(k.startswith("sifting/") for h in trainer.state.log_history for k in h),
        "source": unwrap(loader.orig_dataloader).describe(),
        "rebuilt": unwrap(loader._loader).describe(),
    }


def callback(hooks):
    """A ``TrainerCallback`` with the given hooks (name -> function), built when transformers is imported."""
    from transformers import TrainerCallback

    return type("ScenarioCallback", (TrainerCallback,), hooks)()


def compiles_per_epoch(trainer_box, counts):
    """XLA compilations so far at the end of each Trainer epoch, appended to ``counts``."""

    def on_epoch_end(self, args, state, control, **kwargs):
        counts.append(trainer_box[0].epoch_sifting_dataloader.backend.compile_count())

    return callback({"on_epoch_end": on_epoch_end})


def save_at(steps):
    """Checkpoints at the given global steps only."""
    steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = state.global_step in steps

    return callback({"on_step_end": on_step_end})


class TrainedIds:
    """The classification loss, recording the dataset index of every sample trained on."""

    def __init__(self, data):
        self.index = {tuple(row.tolist()): i for i, row in enumerate(data.ids)}
        self.steps = []

    def __call__(self, outputs, inputs):
        self.steps.append([self.index[tuple(row.tolist())] for row in inputs["input_ids"].cpu()])
        return torch.nn.functional.cross_entropy(outputs["logits"], inputs["labels"], reduction="none")
