"""``SiftingResume``: exact ``Trainer.fit(ckpt_path=...)`` resumes of the sifting loaders.

Lightning already saves a train loader's ``state_dict()`` in its checkpoints and loads it
back before the resumed epoch's iterator is made. What it does not share with the loaders
is where an epoch ends:

- It ends an epoch after as many batches as ``len()`` said, counted from the epoch's start
  (the batches before the checkpoint included), and reads that length once, after the
  restored loader started its iterator. ``ExactLengthLoader`` answers with the full epoch's
  length there, so the count comes out right; a bare ``SiftingDataloader`` or
  ``EpochSiftingDataloader`` answers with its next epoch's (or the resumed rest's) length,
  and the resumed epoch is cut short or the later ones are. Those states are refused.
- A checkpoint taken at an epoch's last batch (``ModelCheckpoint(every_n_train_steps=...)``
  hits one sooner or later, and every ``on_train_epoch_end`` save is one) makes Lightning
  start the next epoch, while the loader's state continues the saved epoch's (empty) rest:
  the first resumed epoch would train nothing and the run would end an epoch early. Here
  the saved epoch is closed in the checkpoint, as the uninterrupted run's next ``iter()``
  closes it, before Lightning loads it.

Both happen in ``on_load_checkpoint``, which Lightning calls before it restores its loops.
Needs ``lightning`` (or the older ``pytorch_lightning``); ``import neuron_sift`` does not.
"""

from collections.abc import Mapping
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - the older package name
    try:
        from pytorch_lightning import Callback  # type: ignore[assignment]  # the same class, older package
    except ImportError as exc:
        raise ImportError(
            "neuron_sift.integrations.lightning_checkpoint needs PyTorch Lightning: pip install lightning"
        ) from exc

from neuron_sift.integrations.exact_length_state import STATE_FORMAT, closed_epoch
from neuron_sift.shared.checkpoints import state_kind

__all__ = ["SiftingResume"]

BARE_KINDS = ("SiftingDataloader", "EpochSiftingDataloader")


class SiftingResume(Callback):
    """Add to ``Trainer(callbacks=[...])`` of every run that saves or resumes: a resume with
    ``trainer.fit(model, ckpt_path=...)`` then continues with the uninterrupted run's
    batches, from a checkpoint taken anywhere (mid-epoch or at an epoch's end).

    ``train_dataloader()`` returns ``ExactLengthLoader(loader, epochs=trainer.max_epochs)``
    around either sifting loader. A checkpoint that
    holds a bare ``SiftingDataloader`` or ``EpochSiftingDataloader`` state is refused with a
    ``ValueError`` saying so: Lightning cannot resume those exactly (module docstring).
    Checkpoints without any loader state are left as they are.
    """

    def __init__(self) -> None:
        super().__init__()
        if _lightning_version() < (2, 5):
            raise RuntimeError(
                f"SiftingResume needs Lightning 2.5 or newer (installed: {'.'.join(map(str, _lightning_version()))}): "
                "older releases resume a checkpoint taken at an epoch's last batch inside that epoch, one epoch "
                "behind the uninterrupted run, so the resumed run would train other batches. pip install 'lightning>=2.5'"
            )

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        fit_loop = _mapping(_mapping(checkpoint.get("loops")).get("fit_loop"))
        loop_state = fit_loop.get("state_dict")
        if not isinstance(loop_state, dict):
            return  # no loop state: nothing of a loader to restore
        states = loop_state.get("combined_loader")
        if not states:
            return
        if not isinstance(states, list):
            raise ValueError(
                f"SiftingResume: the checkpoint's train loader states are a {type(states).__name__}, "
                "not the list Lightning writes; was it saved by this Lightning version?"
            )
        for state in states:
            if state_kind(state) in BARE_KINDS:
                raise ValueError(
                    f"SiftingResume: this checkpoint holds a bare {state_kind(state)}'s state. Lightning ends a "
                    "resumed epoch by a batch count it reads from len() after the loader resumed, which a bare "
                    "sifting loader does not keep, so the resumed run would not train the uninterrupted run's "
                    "batches. Return ExactLengthLoader(loader, epochs=self.trainer.max_epochs) "
                    "(neuron_sift.integrations.schedules) from train_dataloader() and resume from a checkpoint "
                    "saved with it; a checkpoint of the bare loader resumes exactly only in your own loop "
                    "(docs/checkpoints.md)."
                )
        if _starts_next_epoch(fit_loop):
            loop_state["combined_loader"] = [_closed(state) for state in states]


def _lightning_version() -> tuple[int, int]:
    """The installed Lightning's (major, minor): ``lightning`` or the older ``pytorch_lightning``."""
    try:
        import lightning as package
    except ImportError:  # pragma: no cover - the older package name
        import pytorch_lightning as package  # type: ignore[no-redef]
    major, minor = package.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _starts_next_epoch(fit_loop: Mapping[str, Any]) -> bool:
    """Whether Lightning, resuming this fit loop, starts a new epoch rather than continuing one:
    the checkpoint came after the epoch's last batch, or after the epoch was processed."""
    if _mapping(fit_loop.get("epoch_loop.batch_progress")).get("is_last_batch"):
        return True
    current = _mapping(_mapping(fit_loop.get("epoch_progress")).get("current"))
    if "processed" not in current or "started" not in current:
        raise ValueError(
            "SiftingResume: the checkpoint's fit loop has no epoch progress (epoch_progress.current), so "
            "where Lightning resumes cannot be told; was it saved by Trainer.fit?"
        )
    return int(current["processed"]) >= int(current["started"])


def _closed(state: Any) -> Any:
    """An ``ExactLengthLoader`` state with its open epoch closed (what the uninterrupted run's
    next ``iter()`` does: the pass in progress continues, the epoch's count starts again);
    any other state unchanged."""
    if state_kind(state) != STATE_FORMAT.kind:
        return state
    return closed_epoch(state)
