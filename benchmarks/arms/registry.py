"""The registry the suite's arms plug into, and the interface of an arm.

An arm is one way to train a task's model: a function ``arm(ctx) -> dict`` registered
under its name. ``core/runner.py`` builds the ``ArmContext`` (``core/context.py``: the
model with the seed's initial weights, the optimizer, the seeded data, the clock) and times
the call; the arm runs its training loop and reports each optimizer step with ``ctx.trained``.
A plug-in is a module of ``benchmarks/arms/`` with a ``register_arms(register)`` function,
listed in ``PLUGINS`` (``benchmarks/arms/__init__.py``), which calls it once with this
module's ``register``:

    def my_arm(ctx):
        loader = ctx.source                        # or a DataLoader over ctx.dataset and ctx.order(epoch)
        sched = ctx.step_schedule(ctx.epochs * len(loader))   # cosine to 0 at the arm's own end
        for epoch in range(ctx.epochs):            # (or ctx.epoch_schedule(epochs) when epoch lengths vary)
            for x, y, ids in loader:
                x, y = ctx.to_device(x, y)
                per_sample = F.cross_entropy(ctx.model(x), y, reduction="none")
                ctx.optimizer.zero_grad(set_to_none=True)
                per_sample.mean().backward(); ctx.optimizer.step(); sched.step()
                ctx.trained(ids, seen=...)         # source samples passed over so far; evaluates (clock paused)
            ctx.end_epoch()
        return {"samples_kept": ..., "scoring_forward_samples": 0}   # and any extra result keys

``ArmContext`` gives: ``task``, ``data``, ``seed``, ``device``, ``epochs`` (the task's, i.e.
``full``'s), ``beta`` (the kept-share knob of the uniform and sifting arms), ``model`` (on
``device``, train mode), ``optimizer`` (Adam, the task's lr), ``dataset`` (CPU
``TensorDataset(x, y, index)``), ``source`` (a ``DataLoader`` over it, batch size
``task.batch_size``, in the seed's order), ``order(epoch)`` (that order: one permutation
per seed and epoch, the same for every arm), ``step_schedule(total_steps)`` and
``epoch_schedule(epochs)`` (the cosine learning-rate schedule, decayed to the arm's own
end), ``clock`` (wall-clock, paused by the runner while it evaluates), ``evaluate()`` (test
accuracy now, clock paused), ``trained(ids, seen)`` after every optimizer step (counts the
trained samples and evaluates at every ``1 / evals_per_epoch`` epoch of ``seen``),
``end_epoch()`` after each pass. The returned dict may set ``samples_kept`` (default:
samples trained), ``scoring_forward_samples`` (default 0), ``planned_steps`` (default: the
schedule's) and any extra keys, which land in the run's results. The loops the arms here
share (the plain loop, one loss-weighted epoch over a planned subset, one optimizer step)
are in ``core/loops.py``. An arm over a sifting loader sizes its schedule with the library's
plan (``neuron_sift.integrations.schedules.planned_steps``, an ``EpochSiftingDataloader``'s
``planned_steps()``), never with a count of its own.

    def register_arms(register):
        register("my-arm", my_arm, default=False, description="what it trains on")

Registering: ``register(name, fn, default=..., description=...)`` (or
``register(name, ...)`` as a decorator); ``default=True`` adds the arm to the suite's
default ``--arms``, in registration order: the order of ``PLUGINS``, then of each plug-in's
calls. ``single_pass=True`` makes it an arm of the single-pass language-model task
(``lm_suite.py``): it takes an ``LMContext`` (``core/lm_context.py``) instead, and the epoch
tasks' suite neither lists nor accepts it (nor the other way round). A plug-in gets
``register`` as its argument and imports nothing from this package:
it cannot register by any other way, nor lean on another plug-in (what several share is
in ``benchmarks/core/``). ``full@X`` for any X in (0, 1] is resolved on demand
(``get_arm``): the full-data frontier (``frontier.py``).
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.arms.frontier import full_arm


@dataclass
class ArmSpec:
    name: str
    fn: Callable
    default: bool
    description: str
    frontier: float = 0.0  # > 0: a full-data run of this fraction of the epochs
    single_pass: bool = False  # an arm of the single-pass LM task (an LMContext), never of the epoch tasks


ARMS: dict[str, ArmSpec] = {}


def register(
    name: str,
    fn: Callable | None = None,
    *,
    default: bool = False,
    description: str = "",
    frontier: float = 0.0,
    single_pass: bool = False,
) -> Callable:
    """Register ``fn`` as arm ``name`` (also usable as a decorator). A name already taken is an error."""

    def add(f: Callable) -> Callable:
        if name in ARMS:
            raise ValueError(f"arm {name!r} is already registered")
        ARMS[name] = ArmSpec(name, f, default, description, frontier, single_pass)
        return f

    return add(fn) if fn is not None else add


_FULL = re.compile(r"^full@(\d+(?:\.\d*)?|\.\d+)$")


def get_arm(name: str) -> ArmSpec:
    """The registered arm, or a ``full@X`` frontier arm for any fraction X in (0, 1]."""
    if name in ARMS:
        return ARMS[name]
    m = _FULL.match(name)
    if m and 0.0 < float(m.group(1)) <= 1.0:
        x = float(m.group(1))
        return ArmSpec(name, full_arm(x), False, f"all data for {x:g} of the epochs", frontier=x)
    raise KeyError(name)


def default_arms(single_pass: bool = False) -> list[str]:
    """The default arms of the epoch tasks (of the single-pass LM task with ``single_pass``)."""
    return [name for name, spec in ARMS.items() if spec.default and spec.single_pass == single_pass]


def task_arms(single_pass: bool) -> list[str]:
    """Every registered arm of the epoch tasks, or of the single-pass LM task."""
    return [name for name, spec in ARMS.items() if spec.single_pass == single_pass]
