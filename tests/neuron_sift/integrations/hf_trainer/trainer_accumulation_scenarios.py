"""Hugging Face Trainer runs of the epoch mode with gradient accumulation, resumed from every
checkpoint, executed in a subprocess by test_checkpoint.py (``trainer_harness.py`` says
why). Prints one JSON object.

    python -m tests.neuron_sift.integrations.hf_trainer.trainer_accumulation_scenarios

For accumulation 2 and 3, an uninterrupted run over 72 samples in batches of 8 (2 Trainer
epochs of 7 batches: every epoch ends on a short optimizer step) saves a checkpoint
after every optimizer step; a run resumed from each trains what the uninterrupted run
trained after it, or the error it raised is recorded.
"""

import json
import os
import shutil
import tempfile

import transformers

from neuron_sift import EpochSiftConfig
from neuron_sift.integrations.epoch_trainer import enable_epoch_sifting
from tests.neuron_sift.integrations.hf_trainer.trainer_harness import (
    TinyTextClassifier,
    ToyTextDataset,
    TrainedIds,
    callback,
    make_trainer,
)

SAMPLES, EPOCHS = 72, 2


def run(out, accumulation, resume=None, save_every_step=False):
    data = ToyTextDataset(SAMPLES)
    trained = TrainedIds(data)

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = save_every_step

    trainer = make_trainer(
        out,
        n=SAMPLES,
        model=TinyTextClassifier(),
        data=data,
        num_train_epochs=EPOCHS,
        gradient_accumulation_steps=accumulation,
        callbacks=[callback({"on_step_end": on_step_end})],
    )
    enable_epoch_sifting(
        trainer, EpochSiftConfig(kept_share=0.5, seed=1, start_rank_correlation=None), per_sample_loss=trained
    )
    trainer.train(resume_from_checkpoint=resume)
    return trained.steps, trainer.state.global_step, len(trainer.epoch_sifting_stream)


def main():
    results = {}
    for accumulation in (2, 3):
        folder = tempfile.mkdtemp()
        full, global_step, per_epoch = run(folder, accumulation, save_every_step=True)
        saved = sorted(
            (d for d in os.listdir(folder) if d.startswith("checkpoint-")), key=lambda d: int(d.split("-")[1])
        )
        resumed = {}
        for name in saved:
            try:
                steps, resumed_step, _ = run(tempfile.mkdtemp(), accumulation, resume=os.path.join(folder, name))
                resumed[name] = {"steps": steps, "global_step": resumed_step}
            except Exception as exc:  # noqa: BLE001 - recorded for the test to show
                resumed[name] = {"error": f"{type(exc).__name__}: {exc}"}
        shutil.rmtree(folder, ignore_errors=True)
        results[accumulation] = {
            "full": full,
            "global_step": global_step,
            "per_epoch": per_epoch,
            "resumed": resumed,
            "transformers_major": int(transformers.__version__.split(".")[0]),
        }
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
