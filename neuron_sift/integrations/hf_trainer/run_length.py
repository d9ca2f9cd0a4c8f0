"""How long an ``enable_epoch_sifting`` run is: whole planned epochs, and ``max_steps`` inside them.

Why: the epoch loader plans ``num_epochs`` whole epochs (warm-up first, the last ones
annealing on all the data), while the Trainer runs as long as its arguments say. Where the
two differ the run changes meaning without a word: a fractional ``num_train_epochs`` (2.5)
planned 2 epochs and then trained part of an unplanned third; a ``max_steps`` beyond the
plan trained extra full-data epochs after the annealing ones. So, as a user who sets these
arguments expects:

- ``num_train_epochs`` is the plan's length and must be a whole number >= 1
  (``planned_epochs``; a ``ValueError`` says what to set);
- ``max_steps <= 0``: the plan decides, the Trainer runs exactly its optimizer steps;
- ``0 < max_steps`` below the plan's optimizer steps: the Trainer stops there, inside the
  plan, and its learning-rate schedule ends there (``max_steps`` means "stop after this
  many steps"); what the run leaves out of the plan is logged as a warning;
- ``max_steps`` above them: refused (``check_max_steps``), since every step past the plan
  would train epochs nobody planned.

The plan's optimizer steps are ``num_train_epochs * ceil(batches per Trainer epoch /
gradient_accumulation_steps)``, as the Trainer counts them (transformers 4.52 and later, the
releases the metadata admits; earlier ones counted ``floor`` per epoch where the division
leaves a remainder). Whatever the count, a
Trainer that still starts an epoch past an exact plan is stopped at that epoch's first step
(``check_within_plan``).
"""

import math
import numbers
from typing import Any


def planned_epochs(num_train_epochs: Any) -> int:
    """``num_train_epochs`` as the number of epochs to plan; ``ValueError`` unless whole and >= 1."""
    real = isinstance(num_train_epochs, numbers.Real) and not isinstance(num_train_epochs, bool)
    value = float(num_train_epochs) if real else math.nan
    if not (math.isfinite(value) and value.is_integer() and value >= 1):
        nearest = sorted({max(1, math.floor(value)), max(1, math.ceil(value))}) if math.isfinite(value) else []
        suggestion = f" ({' or '.join(str(n) for n in nearest)})" if nearest else ""
        raise ValueError(
            f"enable_epoch_sifting plans whole epochs (the last ones anneal on all the data), so "
            f"num_train_epochs must be a whole number >= 1, got {num_train_epochs!r}: set num_train_epochs to "
            f"the epochs to plan{suggestion}; to stop earlier inside the plan, also set max_steps"
        )
    return int(value)


def plan_optimizer_steps(batches_per_epoch: int, epochs: int, accumulation: int) -> int:
    """Optimizer steps of ``epochs`` Trainer epochs of ``batches_per_epoch`` batches each."""
    return epochs * max(1, math.ceil(batches_per_epoch / max(1, accumulation)))


def check_max_steps(max_steps: Any, batches_per_epoch: int, epochs: int, accumulation: int) -> str | None:
    """``ValueError`` when ``max_steps`` asks for more optimizer steps than the plan holds; the
    warning to log when it stops inside the plan; None when the plan decides the length."""
    if max_steps is None or max_steps <= 0:
        return None
    planned = plan_optimizer_steps(batches_per_epoch, epochs, accumulation)
    if max_steps > planned:
        raise ValueError(
            f"max_steps={max_steps} asks for more optimizer steps than the epoch-sifting plan holds: "
            f"num_train_epochs={epochs} epochs of {batches_per_epoch} batches (gradient_accumulation_steps="
            f"{accumulation}) are {planned} optimizer steps, and every step past them would train an epoch "
            f"nobody planned. Set max_steps=-1 to train the whole plan, or raise num_train_epochs until the "
            f"plan holds {max_steps} steps"
        )
    if max_steps == planned:
        return None
    return (
        f"max_steps={max_steps}: the Trainer stops after {max_steps} of the {planned} optimizer steps that "
        f"the epoch-sifting plan of num_train_epochs={epochs} epochs holds; the rest of the plan (its last, "
        f"annealing epochs among them) is not trained. Set max_steps=-1 to train the whole plan"
    )


def check_within_plan(loader: Any) -> None:
    """``RuntimeError`` once an exact plan's loader has started an epoch past its ``num_epochs``
    (a Trainer counting its steps differently from ``plan_optimizer_steps``)."""
    if loader.num_epochs is None or not loader.length_is_exact or loader.epoch <= loader.num_epochs:
        return
    raise RuntimeError(
        f"the Trainer trains past the epoch-sifting plan of num_train_epochs={loader.num_epochs} epochs "
        f"(epoch {loader.epoch - 1}, 0-based, is not planned): set max_steps=-1, so the plan decides the "
        f"run's length, or raise num_train_epochs"
    )
