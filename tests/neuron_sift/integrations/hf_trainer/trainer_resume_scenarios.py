"""Hugging Face Trainer runs resumed from their own checkpoints, both sifting modes, executed
in a subprocess by test_checkpoint.py (see ``trainer_harness.py`` for why). Prints one
JSON object: what the runs observed.

    python -m tests.neuron_sift.integrations.hf_trainer.trainer_resume_scenarios sifting|epoch_sifting cpu|xla

An uninterrupted run saves checkpoints at the end of its first two Trainer epochs and in the
middle of the second; runs resumed from the last two are compared with it: the
samples of every trained batch, the final weights, the sifting counts and plans, and on XLA
the compilations at each Trainer epoch's end. Then the refusals: a checkpoint without the
sifting state, ``ignore_data_skip=True`` mid-epoch, and (per-batch) a dataset without a length.
"""

import json
import os
import shutil
import sys
import tempfile

import torch
from torch.utils.data import IterableDataset

from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting
from neuron_sift.integrations.hf_trainer.checkpoint import RESUMED
from neuron_sift.integrations.trainer import enable_sifting
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import (
    SiftBertLoss,
    TinyTextClassifier,
    ToyTextDataset,
    callback,
    make_trainer,
    sift_config,
)

EPOCHS = 4


class RecordingClassifier(TinyTextClassifier):
    """Records the dataset index of every sample it trains on (in train mode: the
    per-batch mode scores in eval mode, so only trained batches are recorded)."""

    def __init__(self, data):
        super().__init__()
        self.index = {tuple(row.tolist()): i for i, row in enumerate(data.ids)}
        self.steps = []

    def forward(self, input_ids, attention_mask=None, labels=None):
        if self.training:
            self.steps.append([self.index[tuple(row.tolist())] for row in input_ids.cpu()])
        return super().forward(input_ids, attention_mask, labels)


class Unsized(IterableDataset):
    """The toy data without a length."""

    def __init__(self, data):
        self.data = data

    def __iter__(self):
        return (self.data[i] for i in range(len(self.data)))


def enable(mode, trainer):
    if mode == "sifting":
        return enable_sifting(trainer, sift_config("probabilistic", delay=2), SiftBertLoss())
    return enable_epoch_sifting(
        trainer, {"seed": 0, "kept_share": 0.5, "anneal_fraction": 0.25, "start_rank_correlation": None}
    )


def compile_counts(counts):
    """XLA compilations of the process so far, at each Trainer epoch's end."""

    def on_epoch_end(self, args, state, control, **kwargs):
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")
        counts.append(data[0] if data else 0)

    return callback({"on_epoch_end": on_epoch_end})


def save_mid_epoch_and_at_epoch_ends():
    """Checkpoints at the end of the first two Trainer epochs and half-way through the second
    (the train loader's ``len()`` is the batches of an epoch; one batch per optimizer step).
    On XLA the Trainer's first save compiles graphs of its own (the weights and optimizer
    state brought to the CPU): saving in the first epoch keeps them out of the later ones."""

    def on_step_end(self, args, state, control, train_dataloader=None, **kwargs):
        n = len(train_dataloader)
        control.should_save = state.global_step in (n, n + n // 2, 2 * n)

    return callback({"on_step_end": on_step_end})


def run(mode, out, xla, resume_from=None, save=False, through_module=False):
    """One run; ``through_module``: the Trainer skips through accelerate's function by the
    name transformers.trainer imports, as transformers 4.x does (no get_resumed_dataloader
    hook on the instance: the class's own method calls that name)."""
    data = ToyTextDataset(n=64)
    model = RecordingClassifier(data)
    compiles = []
    callbacks = [compile_counts(compiles)] if xla else []
    if save:
        callbacks.append(save_mid_epoch_and_at_epoch_ends())
    trainer = make_trainer(
        out, model=model, data=data, xla=xla, callbacks=callbacks, num_train_epochs=EPOCHS, learning_rate=1e-2,
        logging_steps=500,
    )  # fmt: skip
    enable(mode, trainer)
    if through_module:
        trainer.__dict__.pop(RESUMED, None)  # transformers 4.x: no such hook, the module route already
    trainer.train(resume_from_checkpoint=resume_from)
    stream = trainer.sifting_stream if mode == "sifting" else trainer.epoch_sifting_stream
    if mode == "sifting":
        sifting = trainer.sifting_dataloader.counts.as_dict()
    else:
        m = trainer.epoch_sifting_dataloader.metrics()
        sifting = {
            "epochs": [(e["kind"], e["kept"]) for e in m["epochs"]],
            "unpaired": m["unpaired_batches"],
            "scores_recorded": m["scores_recorded"],
        }
    return {
        "steps": model.steps,
        "weights": [p.detach().cpu().clone() for p in model.parameters()],
        "global_step": trainer.state.global_step,
        "per_epoch": stream.steps_per_epoch,
        "sifting": sifting,
        "compiles": compiles,
    }


def refusal(train):
    try:
        train()
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def resumes(mode, which):
    xla = which == "xla"
    with tempfile.TemporaryDirectory() as out:
        full = run(mode, out, xla, save=True)
        per_epoch = full["per_epoch"]
        points = {"mid_epoch": per_epoch + per_epoch // 2, "epoch_end": 2 * per_epoch}
        results = {
            "per_epoch": per_epoch,
            "full_steps": full["steps"],
            "full_sifting": full["sifting"],
            "full_compiles": full["compiles"],
            "checkpoints": sorted(int(f.split("-")[1]) for f in os.listdir(out) if f.startswith("checkpoint-")),
            "saved": sorted(f for f in os.listdir(f"{out}/checkpoint-{points['mid_epoch']}") if f.endswith(".pt")),
        }
        for name, step in points.items():
            resumed = run(mode, out, xla, resume_from=f"{out}/checkpoint-{step}")
            results[name] = observed(full, resumed, step)
        step = points["mid_epoch"]
        resumed = run(mode, out, xla, resume_from=f"{out}/checkpoint-{step}", through_module=True)
        results["mid_epoch_through_module"] = observed(full, resumed, step)

        def fresh(data=None, **arguments):
            data = ToyTextDataset(n=64) if data is None else data
            arguments = {"num_train_epochs": EPOCHS, **arguments}
            return enable(mode, make_trainer(out, model=TinyTextClassifier(), data=data, xla=xla, **arguments))

        bare = f"{out}/without_sifting_state"
        shutil.copytree(f"{out}/checkpoint-{step}", bare)
        for f in os.listdir(bare):
            if f.endswith("_rank0.pt"):
                os.remove(os.path.join(bare, f))
        results["refused"] = {
            "no_sifting_state": refusal(lambda: fresh().train(resume_from_checkpoint=bare)),
            "ignore_data_skip": refusal(
                lambda: fresh(ignore_data_skip=True).train(resume_from_checkpoint=f"{out}/checkpoint-{step}")
            ),
        }
        if mode == "sifting":
            results["refused"]["unsized"] = refusal(
                lambda: fresh(Unsized(ToyTextDataset(n=64)), max_steps=8).train(
                    resume_from_checkpoint=f"{out}/checkpoint-{step}"
                )
            )
    return results


def observed(full, resumed, step):
    return {
        "from_step": step,
        "steps": resumed["steps"],
        "global_step": resumed["global_step"],
        "same_weights": all(torch.equal(a, b) for a, b in zip(full["weights"], resumed["weights"], strict=True)),
        "sifting": resumed["sifting"],
        "compiles": resumed["compiles"],
    }


def main():
    mode, which = sys.argv[1:3]
    print("RESULTS " + json.dumps(resumes(mode, which)))


if __name__ == "__main__":
    main()
