"""The sifting state in a Hugging Face ``Trainer``'s checkpoints, for both modes.

Why: the Trainer saves and restores its model, optimizer, schedule, RNG and step counts,
but not a sifting loader's scores, plans and position; a run resumed without them starts
sifting afresh (the delay again, an empty loss history, other batches). So a
``TrainerCallback`` writes the Trainer's sifted stream (the ``ExactLengthLoader`` it
trains from) into every checkpoint folder it saves, one file per process
(``state_file``), and ``train(resume_from_checkpoint=...)`` restores it.

Why the integration answers the Trainer's batch skipping itself: resumed in the middle of
an epoch, the Trainer skips the epoch's trained batches by rebuilding its DataLoader
through accelerate's ``skip_first_batches``, which reads a DataLoader's sampler (and, on
XLA, its device) and cannot replay scores and plans; the stream's own state already
continues the epoch after the checkpoint's batch. So:

- a checkpoint taken at the end of a Trainer epoch is loaded when the Trainer builds its
  train loader (the epoch it ended is closed; the next iteration starts a new one);
- one taken in the middle of an epoch waits until the Trainer asks to skip that epoch's
  trained batches. By then the Trainer has read the whole epoch's ``len()`` (its step
  counts, its schedule), which a stream loaded earlier would have reported as the epoch's
  rest. The skip is answered with the stream itself, loaded with the state, whose next
  iteration yields the rest of the epoch; the skip's count must be the state's position.

Where the skip is asked: transformers 5.x calls ``Trainer.get_resumed_dataloader`` (meant
to be overridden), which the mode's hook set replaces on the instance. Before it existed
(4.x) ``_inner_training_loop`` calls accelerate's ``skip_first_batches`` through the name
``transformers.trainer`` imports; only for a Trainer that skips without the hook, and only
when it resumes mid-epoch, ``install_skip`` replaces that module name, once, by a function
that answers for a sifted stream and hands every other loader to the function it replaced,
unchanged (so other Trainers of the process are unaffected).
"""

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from neuron_sift.integrations.exact_length import ExactLengthLoader
from neuron_sift.integrations.exact_length_state import closed_epoch, read_state
from neuron_sift.integrations.hf_trainer.patch import original

logger = logging.getLogger(
    "neuron_sift.integrations.trainer_checkpoint"
)  # its name before the room: users' logging settings hold

# The file prefix and the enabling call of each mode (the patcher's mode names).
MODES = {"sifting": "enable_sifting", "epoch_sifting": "enable_epoch_sifting"}
RESUMED = "get_resumed_dataloader"  # the Trainer's skip (transformers 5.x)

# Streams whose mid-epoch checkpoint waits for the Trainer's skip: stream -> its state.
_AWAITING: "weakref.WeakKeyDictionary[ExactLengthLoader, dict[str, Any]]" = weakref.WeakKeyDictionary()
_MARK = "_neuron_sift_skip"


def state_file(mode: str, process: int) -> str:
    """The file in a Trainer checkpoint folder holding one process's sifting state."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
    return f"{mode}_rank{process}.pt"


def process_index(trainer: Any) -> int:
    """The Trainer's process: each writes and reads its own file, so no two processes write
    one file (under ``torchrun`` without data parallelism every process sifts as rank 0)."""
    return int(getattr(trainer.args, "process_index", 0) or 0)


def checkpoint_folder(trainer: Any, resume_from_checkpoint: Any) -> str | None:
    """The folder ``train(resume_from_checkpoint=...)`` resumes from, as the Trainer reads the
    argument (``True``: the last checkpoint in ``output_dir``), or None."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        return get_last_checkpoint(trainer.args.output_dir)  # None: the Trainer itself refuses
    return os.fspath(resume_from_checkpoint)


def load_state(folder: str, mode: str, process: int, *, unsharded: bool = False) -> dict[str, Any]:
    """The state a checkpoint folder holds for ``mode`` and ``process``; ``ValueError`` if none.

    ``unsharded``: every process sifts the whole data alike, so process 0's file serves a
    process whose own is missing (0.4.0's epoch mode wrote only that one in such a run)."""
    path = os.path.join(folder, state_file(mode, process))
    if unsharded and not os.path.isfile(path):
        path = os.path.join(folder, state_file(mode, 0))
    if not os.path.isfile(path):
        raise ValueError(
            f"resume_from_checkpoint={folder!r} holds no {state_file(mode, process)}: the checkpoint was not saved "
            f"by a Trainer with {MODES[mode]}, so the sifting scores, plans and position cannot be restored. Resume "
            f"from a checkpoint of a run with {MODES[mode]}, or train without resume_from_checkpoint"
        )
    state: dict[str, Any] = torch.load(path, weights_only=True)
    return state


def restore_at_epoch_end(stream: ExactLengthLoader, state: Any) -> None:
    """Load a state taken at the end of a Trainer epoch, closing that epoch (the stream's
    next iteration starts a new one); ``ValueError`` for another run's state or a state
    taken mid-epoch (which ``restore`` holds for the Trainer's skip instead)."""
    state = read_state(state)
    _check_same_run(stream, state)
    in_epoch = state["epoch_yielded"] or 0
    if in_epoch not in (0, stream.steps_per_epoch):
        raise ValueError(
            f"this state was taken {in_epoch} of {stream.steps_per_epoch} batches into a Trainer epoch, not at its "
            f"end: resume it through train(resume_from_checkpoint=...), which continues the epoch"
        )
    stream.load_state_dict(closed_epoch(state))


def restore(trainer: Any, stream: ExactLengthLoader, state: Any) -> None:
    """Restore a checkpoint's stream state: at once if taken at an epoch's end, at the
    Trainer's skip if taken mid-epoch (see the module docstring)."""
    read = read_state(state)
    _check_same_run(stream, read)
    in_epoch = read["epoch_yielded"] or 0
    if in_epoch in (0, stream.steps_per_epoch):
        restore_at_epoch_end(stream, read)
        return
    if getattr(trainer.args, "ignore_data_skip", False):
        raise ValueError(
            f"the checkpoint was taken {in_epoch} of {stream.steps_per_epoch} batches into a Trainer epoch and "
            f"ignore_data_skip=True asks the Trainer to train that epoch from its start, which the sifting stream "
            f"cannot (it resumes where the checkpoint was taken, without skipping batches): set "
            f"ignore_data_skip=False"
        )
    if not getattr(getattr(trainer, RESUMED, None), _MARK, False):
        install_skip()  # the Trainer skips through accelerate's function, not through our hook
    _AWAITING[stream] = read


def awaiting_skip(stream: Any) -> bool:
    """Whether ``stream`` still waits for the Trainer's skip to load its mid-epoch checkpoint."""
    return isinstance(stream, ExactLengthLoader) and stream in _AWAITING


def forget(stream: Any) -> None:
    """Drop a state still waiting for the Trainer's skip (its ``train()`` ended without one)."""
    if isinstance(stream, ExactLengthLoader):
        _AWAITING.pop(stream, None)


def _check_same_run(stream: ExactLengthLoader, state: dict[str, Any]) -> None:
    if state["steps_per_epoch"] != stream.steps_per_epoch:
        raise ValueError(
            f"the checkpoint's run had {state['steps_per_epoch']} batches per Trainer epoch, this one plans "
            f"{stream.steps_per_epoch}: resume with the same dataset, batch size, num_train_epochs and sifting config"
        )


def skip_stream(stream: ExactLengthLoader, num_batches: int) -> ExactLengthLoader:
    """The Trainer's skip of ``num_batches`` trained batches of a sifted stream: the stream,
    loaded with its checkpoint (taken that many batches into the epoch)."""
    state = _AWAITING.pop(stream, None)
    if state is None:
        raise ValueError(
            f"the Trainer asked to skip {num_batches} batches of a sifted stream that holds no mid-epoch checkpoint "
            f"to resume: a sifting loader cannot skip batches by rebuilding its DataLoader. Resume with "
            f"train(resume_from_checkpoint=...) from a checkpoint of a Trainer with sifting enabled, saved with "
            f"the same arguments"
        )
    in_epoch = state["epoch_yielded"]
    if in_epoch != num_batches:
        raise ValueError(
            f"the Trainer resumes {num_batches} batches into its epoch but the sifting checkpoint was taken "
            f"{in_epoch} batches into it: resume with the arguments the checkpoint was saved with "
            f"(gradient_accumulation_steps, batch size, num_train_epochs)"
        )
    stream.load_state_dict(state)
    logger.info("resumed the sifted stream %d batches into its epoch", num_batches)
    return stream


def install_skip() -> None:
    """Replace ``transformers.trainer.skip_first_batches`` once (transformers 4.x, see the
    module docstring)."""
    import transformers.trainer as transformers_trainer

    replaced = getattr(transformers_trainer, "skip_first_batches", None)
    if replaced is None:
        raise RuntimeError(
            "this transformers' Trainer has neither get_resumed_dataloader nor skip_first_batches: the sifted "
            "stream cannot answer its skip of a mid-epoch checkpoint's trained batches"
        )
    if getattr(replaced, _MARK, False):
        return

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if isinstance(dataloader, ExactLengthLoader):
            return skip_stream(dataloader, num_batches)
        return replaced(dataloader, num_batches)

    setattr(skip_first_batches, _MARK, True)
    skip_first_batches.__wrapped__ = replaced  # type: ignore[attr-defined]
    transformers_trainer.skip_first_batches = skip_first_batches


class TrainerCheckpoints:
    """One mode's sifting state in the checkpoints of one Trainer: ``methods`` (for the mode's
    hook set) note the folder a ``train()`` resumes from and answer the Trainer's skip,
    ``restore_into`` loads the folder's state into the stream the Trainer builds, and
    ``callback`` saves the stream into each checkpoint."""

    def __init__(self, trainer: Any, mode: str, attribute: str) -> None:
        state_file(mode, 0)  # the mode is known
        self.trainer = trainer
        self.mode = mode
        self.attribute = attribute  # the Trainer's attribute holding the mode's stream
        self.folder: str | None = None  # the checkpoint the current train() resumes from

    def methods(self) -> dict[str, Callable[..., Any]]:
        """``train`` and, where the Trainer has it (transformers 5.x), ``get_resumed_dataloader``."""
        trainer = self.trainer
        train = original(trainer, "train")

        def hooked_train(resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
            self.folder = checkpoint_folder(trainer, resume_from_checkpoint)
            try:
                return train(resume_from_checkpoint, *args, **kwargs)
            finally:
                self.folder = None
                forget(getattr(trainer, self.attribute, None))

        methods: dict[str, Callable[..., Any]] = {"train": hooked_train}
        if callable(getattr(trainer, RESUMED, None)):
            resumed = original(trainer, RESUMED)

            def get_resumed_dataloader(dataloader: Any, num_batches: int) -> Any:
                if isinstance(dataloader, ExactLengthLoader):
                    return skip_stream(dataloader, num_batches)
                return resumed(dataloader, num_batches)

            setattr(get_resumed_dataloader, _MARK, True)
            methods[RESUMED] = get_resumed_dataloader
        return methods

    def restore_into(self, stream: ExactLengthLoader) -> None:
        """Restore the resumed checkpoint's state into ``stream`` (nothing when not resuming)."""
        if self.folder is None:
            return
        process = process_index(self.trainer)
        unsharded = stream.loader.ranks.world_size == 1
        restore(self.trainer, stream, load_state(self.folder, self.mode, process, unsharded=unsharded))

    def callback(self) -> Any:
        """A ``TrainerCallback`` writing the stream into each checkpoint the Trainer saves, and
        refusing to train a stream whose mid-epoch checkpoint the Trainer never skipped to (it
        would train that epoch from a fresh state)."""
        from transformers import TrainerCallback
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        trainer, mode, attribute = self.trainer, self.mode, self.attribute

        class SaveSifting(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                stream = getattr(trainer, attribute, None)
                if not isinstance(stream, ExactLengthLoader):
                    return
                # Every process writes its own file; a node whose disk the main process's
                # folder is not on gets the folder here.
                folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
                os.makedirs(folder, exist_ok=True)
                torch.save(stream.state_dict(), os.path.join(folder, state_file(mode, process_index(trainer))))

            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if awaiting_skip(getattr(trainer, attribute, None)):
                    raise RuntimeError(
                        "the Trainer resumed a mid-epoch checkpoint without skipping the epoch's trained batches, "
                        "so the sifted stream was not restored; resume with the arguments the checkpoint was saved with"
                    )

        return SaveSifting()
