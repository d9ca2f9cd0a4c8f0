"""The one patcher of a Hugging Face ``Trainer``: its own methods kept once, one mode's hooks installed.

Why: ``enable_sifting`` and ``enable_epoch_sifting`` each replace a few of the Trainer's
methods. Wrapping whatever is there would wrap the other mode's hooks (enabling one mode
after the other would sift twice, or sift one mode's batches with the other's loss).
Here the Trainer's original methods are saved at the first patch, and every install first
restores them, the attributes it set and the callbacks it added, so enabling a mode
replaces the one before (or the same mode's earlier settings).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from neuron_sift.metrics.sifting_metrics import collect_metrics

# Every method any mode patches: saved once, restored before each install (a Trainer without
# one, such as transformers 4.x without get_resumed_dataloader, has it neither saved nor patched).
PATCHED = ("get_train_dataloader", "compute_loss", "log", "train", "get_resumed_dataloader")
_SAVED = "_neuron_sift_originals"
_MISSING = object()


@dataclass
class HookSet:
    """One mode's patch: ``methods`` replacing the Trainer's (each may call ``original``),
    ``attributes`` set on the Trainer (their previous values come back when another set is
    installed) and ``callbacks`` added to it (removed then)."""

    mode: str
    methods: dict[str, Callable[..., Any]]
    attributes: dict[str, Any] = field(default_factory=dict)
    callbacks: list[Any] = field(default_factory=list)


def _saved(trainer: Any) -> dict[str, Any]:
    saved = trainer.__dict__.get(_SAVED)
    if saved is None:
        saved = {
            "methods": {name: getattr(trainer, name) for name in PATCHED if hasattr(trainer, name)},
            "own": {name for name in PATCHED if name in trainer.__dict__},  # set on the instance before us
            "attributes": {},
            "callbacks": [],
            "mode": None,
        }
        trainer.__dict__[_SAVED] = saved
    return saved


def original(trainer: Any, name: str) -> Any:
    """The Trainer's own ``name`` method, as it was before any mode patched it."""
    return _saved(trainer)["methods"][name]


def installed_mode(trainer: Any) -> str | None:
    """The mode whose hooks the Trainer runs (``"sifting"``, ``"epoch_sifting"``) or None."""
    saved = trainer.__dict__.get(_SAVED)
    return None if saved is None else saved["mode"]


def restore(trainer: Any) -> None:
    """Put the Trainer back as it was before any mode was enabled."""
    saved = _saved(trainer)
    for name, method in saved["methods"].items():
        if name in saved["own"]:
            setattr(trainer, name, method)
        else:
            trainer.__dict__.pop(name, None)
    for name, value in saved["attributes"].items():
        if value is _MISSING:
            trainer.__dict__.pop(name, None)
        else:
            setattr(trainer, name, value)
    saved["attributes"] = {}
    for callback in saved["callbacks"]:
        trainer.remove_callback(callback)
    saved["callbacks"] = []
    saved["mode"] = None


def install(trainer: Any, hooks: HookSet) -> Any:
    """Restore the Trainer's own methods, then install ``hooks``; returns ``trainer``."""
    restore(trainer)
    saved = _saved(trainer)
    for name, value in hooks.attributes.items():
        saved["attributes"][name] = trainer.__dict__.get(name, _MISSING)
        setattr(trainer, name, value)
    for callback in hooks.callbacks:
        trainer.add_callback(callback)
        saved["callbacks"].append(callback)
    for name, method in hooks.methods.items():
        if name not in PATCHED:
            raise AssertionError(f"{name} is not a method the patcher saves")
        setattr(trainer, name, method)
    saved["mode"] = hooks.mode
    return trainer


def log_hook(trainer: Any, attribute: str, prefix: str, enabled: bool) -> Callable[..., Any]:
    """``Trainer.log`` adding the snapshot scalars of ``trainer.<attribute>`` (the mode's
    loader) under ``prefix`` to every training log (each ``logging_steps`` and the final one)."""
    log = original(trainer, "log")

    def hooked(logs: Any, *args: Any, **kwargs: Any) -> Any:
        loader = getattr(trainer, attribute, None)
        if enabled and loader is not None and isinstance(logs, dict) and ("loss" in logs or "train_runtime" in logs):
            logs.update(collect_metrics(loader).scalars(prefix=prefix))
        return log(logs, *args, **kwargs)

    return hooked


def require_trainer(trainer: Any) -> None:
    if not callable(getattr(trainer, "get_train_dataloader", None)) or not hasattr(trainer, "args"):
        raise TypeError(f"trainer must be a transformers.Trainer, got {type(trainer).__name__}")
