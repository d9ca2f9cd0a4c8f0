"""Hugging Face Trainer runs with ``enable_epoch_sifting``, in a subprocess (USE_TORCH_XLA=0,
see tests/neuron_sift/integrations/trainer_scenarios.py). Prints one JSON object.

    python -m tests.neuron_sift.epoch.epoch_trainer_scenarios
"""

import json
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting


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
    }


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
        out["classification"] = run(bert, Toy(), d)
        out["causal_lm"] = run(gpt, Toy(lm=True), d, accumulate=2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
