"""The table of bad states for ``resuming/test_bad_states.py``: a loader's state one batch into a
sifted epoch (``saved``), and ``BAD``: name -> (which loader, an edit of its state, what the
refusal must say). The edits are what a user's hand (or a damaged file) can do to a state:
wrong types, shapes and dtypes, positions past the plan or negative, NaN, infinite or
negative weights, ids outside the dataset or the sampler or twice, lists where tensors
belong, missing keys, another rank or world size."""

import functools
import math

import torch
from torch.utils.data import DataLoader, SubsetRandomSampler

from neuron_sift import EpochSiftingDataloader
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle_loss

N, BATCH, EPOCHS = 60, 8, 4
CONFIG = {"seed": 2, "kept_share": 0.5, "noise_guard_epochs": 1, **PRUNE_FROM_THE_START}
SPLIT = list(range(0, N, 2))  # the "subset" loader's sampler: the even ids
CHANGED = "the state's content does not match its checksum: it was changed after state_dict\\(\\) wrote it"


def new_loader(table="replicated"):
    """``replicated`` or ``sharded`` score table over every sample; ``subset``: a replicated
    table over a SubsetRandomSampler of the even ids."""
    subset = table == "subset"
    sampler = SubsetRandomSampler(SPLIT) if subset else None
    dl = DataLoader(IdDataset(N), batch_size=BATCH, sampler=sampler, shuffle=not subset)
    cfg = {**CONFIG, "score_table": "replicated" if subset else table}
    return EpochSiftingDataloader(cfg, dl, num_epochs=EPOCHS)


def train_epochs(loader, epochs):
    """The ids trained in ``epochs`` epochs of the user's loop."""
    seen = []
    for _ in range(epochs):
        for x, _y in loader:
            seen += ids_of(x)
            loader.weighted_loss(oracle_loss(x))
    return seen


@functools.cache
def saved(table):
    """A state one batch into the second sifted epoch (the guard on), read back from disk."""
    loader = new_loader(table)
    train_epochs(loader, 2)
    x, _y = next(iter(loader))
    loader.weighted_loss(oracle_loss(x))
    state = roundtrip(loader.state_dict())
    assert state["progress"]["position"] == 1 and state["progress"]["plan"]["kind"] == "sift"
    return state


def plan(state):
    return state["progress"]["plan"]


def first_id(state):
    return int(plan(state)["order"][0])


def put(*path, value):
    """An edit that sets the field at ``path`` (keys into the state) to ``value(state)``."""

    def edit(state):
        holder = state
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value(state)

    return edit


def drop(*path):
    def edit(state):
        holder = state
        for key in path[:-1]:
            holder = holder[key]
        del holder[path[-1]]

    return edit


def entry(tensor, at, value):
    """``tensor`` with entry ``at`` set to ``value`` (each a number or a function of the state)."""

    def make(state):
        out = tensor(state).clone()
        out[at(state) if callable(at) else at] = value(state) if callable(value) else value
        return out

    return make


def order(s):
    return plan(s)["order"]


def weights(s):
    return plan(s)["weights"]


def outside_plan(s):
    """An id the plan does not train."""
    return torch.tensor([next(i for i in range(N) if i not in set(order(s).tolist()))])


def with_done(done):
    """The plan as a plan resumed at another world size (``done``: a function of the state)."""

    def edit(state):
        plan(state)["done"], plan(state)["world_size"] = done(state), 1

    return edit


R, S, U = "replicated", "sharded", "subset"
POSITION = r"progress\.position must be in 0\.\.\d+ \(batches of this rank's \d+ in epoch 2 \(0-based\) whose losses"
BAD = {
    # the planner: another rank or world size, another setup, a seed that is no seed
    "seed-as-str": (R, put("planner", "seed", value=lambda s: "2"), r"planner\.seed must be an int, got str '2'"),
    "seed-negative": (R, put("planner", "seed", value=lambda s: -1), r"planner\.seed must be in 0\.\.\d+ .*got -1"),
    "world-size": (
        R,
        put("planner", "world_size", value=lambda s: 2),
        r"world_size=2, rank=0 but this loader has world_size=1, rank=0: .*load_state_dict_from_ranks\(states\)",
    ),
    "rank": (R, put("planner", "rank", value=lambda s: 1), r"rank=1 but .*load_state_dict_from_ranks"),
    "planner-without-n": (R, drop("planner", "n"), r"planner has no n"),
    "another-n": (R, put("planner", "n", value=lambda s: 61), r"checkpoint has n=61 but this loader has 60"),
    # the position in the epoch
    "position-past-the-plan": (R, put("progress", "position", value=lambda s: 999), POSITION + r".*got 999"),
    "position-negative": (R, put("progress", "position", value=lambda s: -5), POSITION + r".*got -5"),
    "position-one-past-the-end": (  # the boundary: the end itself (every batch done) is valid
        R,
        put("progress", "position", value=lambda s: -(-len(order(s)) // BATCH) + 1),
        POSITION + r".*got 5",
    ),
    "position-as-float": (R, put("progress", "position", value=lambda s: 1.0), r"progress\.position must be an int"),
    "position-as-tensor": (
        R,
        put("progress", "position", value=lambda s: torch.tensor(1)),
        r"progress\.position must be an int, got a torch\.int64 tensor",
    ),
    "epochs-started-as-str": (
        R,
        put("progress", "epochs_started", value=lambda s: "3"),
        r"progress\.epochs_started must be an int",
    ),
    "in-progress-as-int": (
        R,
        put("progress", "in_progress", value=lambda s: 1),
        r"progress\.in_progress must be a bool",
    ),
    "in-progress-copy": (
        R,
        put("in_progress", value=lambda s: False),
        r"in_progress differs from progress\.in_progress",
    ),
    # the plan
    "plan-of-another-epoch": (
        R,
        put("progress", "plan", "epoch", value=lambda s: 7),
        r"progress\.plan\.epoch is 7 but progress\.epochs_started is 3",
    ),
    "plan-kind": (R, put("progress", "plan", "kind", value=lambda s: "sifted"), r"progress\.plan\.kind must be one of"),
    "plan-without-order": (R, drop("progress", "plan", "order"), r"progress\.plan has no order"),
    "no-plan-after-epochs": (R, put("progress", "plan", value=lambda s: None), r"progress\.plan is None but 3 epoch"),
    "order-as-list": (
        R,
        put("progress", "plan", "order", value=lambda s: order(s).tolist()),
        r"progress\.plan\.order must be a torch\.int32 or torch\.int64 tensor, got list",
    ),
    "order-as-float": (
        R,
        put("progress", "plan", "order", value=lambda s: order(s).float()),
        r"progress\.plan\.order must be a .* tensor, got torch\.float32",
    ),
    "order-2d": (
        R,
        put("progress", "plan", "order", value=lambda s: order(s).reshape(2, -1)),
        r"progress\.plan\.order must be a 1-D tensor, got shape \[2, 15\]",
    ),
    "order-id-past-the-dataset": (
        R,
        put("progress", "plan", "order", value=entry(order, 0, N + 5)),
        r"progress\.plan\.order holds sample id 65, outside the dataset's 0\.\.59",
    ),
    "order-id-equal-to-n": (  # the boundary: n itself is one past the last id
        R,
        put("progress", "plan", "order", value=entry(order, 0, N)),
        r"progress\.plan\.order holds sample id 60, outside the dataset's 0\.\.59",
    ),
    "order-id-negative": (
        R,
        put("progress", "plan", "order", value=entry(order, 0, -1)),
        r"progress\.plan\.order holds sample id -1",
    ),
    "order-id-twice": (
        R,
        put("progress", "plan", "order", value=entry(order, 1, first_id)),
        r"progress\.plan\.order holds a sample id twice",
    ),
    "order-id-outside-the-sampler": (
        U,
        put("progress", "plan", "order", value=entry(order, 0, 1)),
        r"progress\.plan\.order holds sample id 1, which this loader's sampler never yields",
    ),
    "weights-nan": (
        R,
        put("progress", "plan", "weights", value=entry(weights, first_id, math.nan)),
        r"progress\.plan\.weights holds NaN",
    ),
    "weights-infinite": (
        R,
        put("progress", "plan", "weights", value=entry(weights, first_id, math.inf)),
        r"progress\.plan\.weights holds an infinite value",
    ),
    "weights-zero": (  # the boundary: a weight is 1 / keep probability, never 0
        R,
        put("progress", "plan", "weights", value=entry(weights, first_id, 0.0)),
        r"progress\.plan\.weights holds 0\.0, must be > 0",
    ),
    "weights-negative": (
        R,
        put("progress", "plan", "weights", value=entry(weights, first_id, -2.0)),
        r"progress\.plan\.weights holds -2\.0, must be > 0",
    ),
    "weights-short": (
        R,
        put("progress", "plan", "weights", value=lambda s: weights(s)[:-1]),
        r"progress\.plan\.weights must hold 60 entries \(one per entry of this rank's table\), got 59",
    ),
    "weights-float64": (
        R,
        put("progress", "plan", "weights", value=lambda s: weights(s).double()),
        r"progress\.plan\.weights must be a torch\.float32 tensor, got torch\.float64",
    ),
    "weights-as-list": (
        R,
        put("progress", "plan", "weights", value=lambda s: weights(s).tolist()),
        r"progress\.plan\.weights must be a torch\.float32 tensor, got list",
    ),
    "inclusion-above-one": (
        R,
        put("progress", "plan", "inclusion", value=entry(lambda s: plan(s)["inclusion"], first_id, 1.5)),
        r"progress\.plan\.inclusion holds 1\.5, must be <= 1\.0",
    ),
    "excluded-negative": (
        R,
        put("progress", "plan", "excluded", value=lambda s: -1),
        r"progress\.plan\.excluded must be in 0\.\.60",
    ),
    "done-outside-the-plan": (
        R,
        with_done(outside_plan),
        r"progress\.plan\.done holds sample id \d+, which the plan does not train",
    ),
    "done-as-list": (
        R,
        with_done(lambda s: [first_id(s)]),
        r"progress\.plan\.done must be a torch\.int32 or torch\.int64 tensor, got list",
    ),
    "done-without-world-size": (
        R,
        put("progress", "plan", "done", value=lambda s: order(s)[:1].clone()),
        r"progress\.plan\.world_size must be an int, got NoneType",
    ),
    # the score table
    "scores-long": (
        R,
        put("tables", "scores", value=lambda s: torch.cat([s["tables"]["scores"], torch.zeros(1)])),
        r"tables\.scores must hold 60 entries \(one per entry of this rank's table\), got 61",
    ),
    "scores-infinite": (
        R,
        put("tables", "scores", value=entry(lambda s: s["tables"]["scores"], 0, -math.inf)),
        r"tables\.scores holds an infinite value",
    ),
    "scores-float64": (
        R,
        put("tables", "scores", value=lambda s: s["tables"]["scores"].double()),
        r"tables\.scores must be a torch\.float32 tensor, got torch\.float64",
    ),
    "scores-as-list": (
        R,
        put("tables", "scores", value=lambda s: s["tables"]["scores"].tolist()),
        r"tables\.scores must be a torch\.float32 tensor, got list",
    ),
    "nonfinite-negative": (R, put("tables", "nonfinite", value=lambda s: -2), r"tables\.nonfinite must be in 0\.\."),
    "tables-without-scores": (R, drop("tables", "scores"), r"tables has no scores"),
    # the ranks' shares, the guard, the counts, the record
    "mine-short": (
        R,
        put("shares", "mine", value=lambda s: s["shares"]["mine"][:-2]),
        r"shares\.mine must hold 60 entries \(one per sample\), got 58",
    ),
    "carried-as-uint8": (
        R,
        put("shares", "carried", value=lambda s: s["shares"]["carried"].to(torch.uint8)),
        r"shares\.carried must be a torch\.bool tensor, got torch\.uint8",
    ),
    "streak-short": (
        R,
        put("guard", "streak", value=lambda s: s["guard"]["streak"][:10]),
        r"guard\.streak must hold 60 entries \(one per entry of this rank's table\) or none, got 10",
    ),
    "streak-negative": (
        R,
        put("guard", "streak", value=entry(lambda s: s["guard"]["streak"], 0, -1)),
        r"guard\.streak holds -1, must be >= 0",
    ),
    "streak-int64": (
        R,
        put("guard", "streak", value=lambda s: s["guard"]["streak"].long()),
        r"guard\.streak must be a torch\.int32 tensor, got torch\.int64",
    ),
    "count-negative": (
        R,
        put("pairing", "losses_recorded", value=lambda s: -1),
        r"pairing\.losses_recorded must be in 0\.\., got -1",
    ),
    "count-as-str": (
        R,
        put("pairing", "batches_recorded", value=lambda s: "3"),
        r"pairing\.batches_recorded must be an int, got str",
    ),
    "fewer-yielded-than-recorded": (
        R,
        put("pairing", "batches_yielded", value=lambda s: 0),
        r"pairing\.batches_yielded is 0, fewer than the \d+ batches recorded or skipped",
    ),
    "pairing-as-list": (R, put("pairing", value=lambda s: [1]), r"pairing must be a dict, got list"),
    "history-not-a-list": (R, put("history", "epochs", value=lambda s: "x"), r"history\.epochs must be a list"),
    "history-entry-without-kind": (R, drop("history", "epochs", 0, "kind"), r"history\.epochs\[0\] has no kind"),
    "history-kept-negative": (
        R,
        put("history", "epochs", 1, "kept", value=lambda s: -3),
        r"history\.epochs\[1\]\.kept must be in 0\.\., got -3",
    ),
    "history-weight-nan": (
        R,
        put("history", "epochs", 1, "mean_weight", value=lambda s: math.nan),
        r"history\.epochs\[1\]\.mean_weight must be a finite number",
    ),
    "part-missing": (R, drop("guard"), r"incomplete: no guard"),
    # a sharded table's own layout
    "sharded-shares-not-empty": (
        S,
        put("shares", value=lambda s: {"mine": torch.zeros(N, dtype=torch.bool)}),
        r"shares must be empty under a sharded score table",
    ),
    "sharded-plan-with-inclusion": (
        S,
        put("progress", "plan", "inclusion", value=lambda s: torch.ones(N)),
        r"progress\.plan\.inclusion must be absent under a sharded score table",
    ),
    "sharded-weights-nan": (
        S,
        put("progress", "plan", "weights", value=entry(weights, first_id, math.nan)),
        r"progress\.plan\.weights holds NaN",
    ),
    "sharded-order-id-twice": (
        S,
        put("progress", "plan", "order", value=entry(order, 1, first_id)),
        r"progress\.plan\.order holds a sample id twice",
    ),
    "sharded-position-past-the-plan": (S, put("progress", "position", value=lambda s: 999), POSITION),
    "sharded-scores-short": (
        S,
        put("tables", "scores", value=lambda s: s["tables"]["scores"][:-1]),
        r"tables\.scores must hold 60 entries",
    ),
}
