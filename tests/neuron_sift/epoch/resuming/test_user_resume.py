"""Resuming as users resume: a model that trains between steps, its optimizer and the epoch
loader checkpointed together and restored into fresh objects. The resumed run must be the
uninterrupted one: the same batches, the same values ``weighted_loss`` returns (so the
same weights), the same final parameters and scores. Also: a run without a seed resumed
in a new process, the non-finite count, and version 1's data-parallel fields."""

import functools
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader
from tests.helpers.state_roundtrip import roundtrip
from tests.helpers.subprocess_limits import LIMIT_S
from tests.neuron_sift.epoch.helpers import (
    PRUNE_FROM_THE_START,
    ROOT,
    IdDataset,
    Prefetcher,
    oracle_loss,
    version_1_state,
)

N, BATCH, EPOCHS = 90, 8, 4  # full epochs: 12 batches (the last of 2); sifted ones about 6


def dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 4, generator=g)
    y = (x[:, 0] - x[:, 1] + 0.3 * torch.randn(N, generator=g) > 0).long()
    return TensorDataset(torch.arange(N), x, y)


class Trainee:
    """A linear classifier, SGD with momentum and the epoch loader, trained step by step."""

    def __init__(self, cfg, **loader_kw):
        self.model = torch.nn.Linear(4, 2)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            self.model.weight.copy_(0.1 * torch.randn(2, 4, generator=g))
            self.model.bias.zero_()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.5, momentum=0.9)
        source = DataLoader(dataset(), batch_size=BATCH, shuffle=True, **loader_kw)
        self.loader = EpochSiftingDataloader(cfg, source, num_epochs=EPOCHS)
        self.log = []  # (ids, the value weighted_loss returned) per step

    def step(self, batch):
        ids, x, y = batch
        out = self.loader.weighted_loss(F.cross_entropy(self.model(x), y, reduction="none"))
        self.opt.zero_grad()
        out.backward()
        self.opt.step()
        self.log.append((ids.tolist(), out.detach()))

    def train(self, stop=None, wrap=None):
        """To the end of the run (after a resume: the rest of the epoch first), or ``stop`` steps."""
        while self.loader.epoch < EPOCHS or self.loader.resuming:
            for batch in wrap(self.loader) if wrap else self.loader:
                self.step(batch)
                if stop is not None and len(self.log) == stop:
                    return self
        return self

    def state_dict(self):
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "loader": self.loader.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.loader.load_state_dict(state["loader"])

    def params(self):
        return torch.cat([p.detach().flatten() for p in self.model.parameters()])


def assert_resumed_run_is_the_uninterrupted_one(before, after, full):
    """``before`` stopped, ``after`` resumed from its checkpoint, ``full`` never stopped."""
    log = before.log + after.log
    assert [ids for ids, _ in log] == [ids for ids, _ in full.log]
    for step, ((_, out), (_, ref)) in enumerate(zip(log, full.log)):
        assert torch.equal(out, ref), f"step {step}: weighted_loss returned {out.item()}, not {ref.item()}"
    assert torch.equal(after.params(), full.params())
    torch.testing.assert_close(after.loader.tables.snapshot(), full.loader.tables.snapshot(), rtol=0, atol=0)
    assert without_timings(after.loader.history) == without_timings(full.loader.history)


def without_timings(history):
    return [{k: v for k, v in h.items() if k != "planning_seconds"} for h in history]


@functools.cache
def _uninterrupted(key):
    return Trainee(json.loads(key)).train()


def uninterrupted(cfg):
    """The run never stopped (trained once per config; only read afterwards)."""
    return _uninterrupted(json.dumps(cfg, sort_keys=True))


CFGS = {
    "percentile": {**PRUNE_FROM_THE_START, "seed": 5},
    "below_mean-budget": {**PRUNE_FROM_THE_START, "seed": 5, "policy": "below_mean", "kept_share": 0.5},
    "guard": {**PRUNE_FROM_THE_START, "seed": 5, "noise_guard_epochs": 1, "noise_guard_quantile": 0.8},
}


@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
@pytest.mark.parametrize("stop", [1, 12, 14, 17])  # in the warm-up, at its end, in the first sifted epoch
def test_a_resumed_training_run_is_the_uninterrupted_one(cfg, stop):
    full = uninterrupted(cfg)
    a = Trainee(cfg).train(stop=stop)
    assert len(a.log) == stop
    b = Trainee(cfg)
    b.load_state_dict(roundtrip(a.state_dict()))
    assert_resumed_run_is_the_uninterrupted_one(a, b.train(), full)
    if stop > 12:
        assert a.loader.plan.kind == "sift" and float(a.loader.plan.weights.max()) > 1  # weights that matter


@pytest.mark.parametrize("stop", [14, 19])
def test_a_resume_after_batches_prefetched_but_not_trained(stop):
    """A wrapper pulls up to 4 batches ahead; the sifted epoch has 9. Stopped after 2 of them
    (the wrapper is still pulling) or after 7 (it has pulled the whole epoch): the batches
    pulled but not trained are yielded again."""
    cfg = {**PRUNE_FROM_THE_START, "seed": 2, "kept_share": 0.8}
    full = uninterrupted(cfg)
    a = Trainee(cfg).train(stop=stop, wrap=lambda loader: Prefetcher(loader, depth=3))
    b = Trainee(cfg)
    b.load_state_dict(roundtrip(a.state_dict()))
    assert_resumed_run_is_the_uninterrupted_one(a, b.train(), full)


def test_a_resume_with_workers():
    cfg = {**PRUNE_FROM_THE_START, "seed": 4, "kept_share": 0.3}
    kw = {"num_workers": 1, "persistent_workers": True}
    full = Trainee(cfg, **kw).train()
    a = Trainee(cfg, **kw).train(stop=14)
    b = Trainee(cfg, **kw)
    b.load_state_dict(roundtrip(a.state_dict()))
    assert_resumed_run_is_the_uninterrupted_one(a, b.train(), full)


def as_version_1(state):
    """A current state in version 1's flat layout (what the code before the split wrote)."""
    flat = {"version": 1, "kind": state["kind"], "in_progress": state["in_progress"]}
    for part in ("planner", "progress", "tables", "shares", "guard"):
        flat.update(state[part])
    flat["history"] = state["history"]["epochs"]
    flat["counts"] = {k: v for k, v in state["pairing"].items() if k != "dropped_batches"}
    return flat


def test_a_version_1_state_of_a_training_run_resumes_it():
    cfg = {**PRUNE_FROM_THE_START, "seed": 6, "noise_guard_epochs": 1, "noise_guard_quantile": 0.8}
    full = Trainee(cfg).train()
    a = Trainee(cfg).train(stop=15)
    state = roundtrip(a.state_dict())
    state["loader"] = as_version_1(state["loader"])
    b = Trainee(cfg)
    b.load_state_dict(state)
    assert_resumed_run_is_the_uninterrupted_one(a, b.train(), full)


# -- a run without a seed, resumed in a new process ----------------------------------------

SEEDLESS = {"kept_share": 0.5}  # no seed: the plans follow torch.initial_seed() of the first process


def continue_in_a_new_process(checkpoint, out, threads):
    """Run by the test in a fresh interpreter: resume from ``checkpoint``, write what it saw."""
    torch.set_num_threads(threads)
    t = Trainee(SEEDLESS)
    seed_before = t.loader.seed
    t.load_state_dict(torch.load(checkpoint, weights_only=True))
    t.train()
    result = {
        "seed_before": seed_before,
        "seed": t.loader.seed,
        "ids": [ids for ids, _ in t.log],
        "losses": [float(v) for _, v in t.log],
        "params": t.params().tolist(),
    }
    with open(out, "w") as f:
        json.dump(result, f)


@pytest.mark.slow
def test_a_run_without_a_seed_resumes_in_a_new_process(tmp_path):
    full = Trainee(SEEDLESS).train()
    a = Trainee(SEEDLESS).train(stop=15)  # in epoch 1; epochs 2 and 3 are planned after the resume
    torch.save(a.state_dict(), tmp_path / "checkpoint.pt")
    code = (
        "import sys; from tests.neuron_sift.epoch.resuming.test_user_resume import continue_in_a_new_process as go; "
        "go(sys.argv[1], sys.argv[2], int(sys.argv[3]))"
    )
    args = [str(tmp_path / "checkpoint.pt"), str(tmp_path / "out.json"), str(torch.get_num_threads())]
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["seed_before"] != full.loader.seed  # the new process's own seed ...
    assert got["seed"] == full.loader.seed  # ... replaced by the checkpoint's
    rest = full.log[15:]
    assert got["ids"] == [ids for ids, _ in rest]
    assert got["losses"] == [float(v) for _, v in rest]
    assert got["params"] == full.params().tolist()


# -- counts and fields that travel in the checkpoint ----------------------------------------


def test_the_nonfinite_count_survives_a_resume():
    def new():
        return EpochSiftingDataloader(
            {**PRUNE_FROM_THE_START, "seed": 1}, DataLoader(IdDataset(40), batch_size=8), num_epochs=3
        )

    a = new()
    it = iter(a)
    for bad in (2, 1):
        x, _y = next(it)
        losses = oracle_loss(x)
        losses[:bad] = float("nan")
        a.weighted_loss(losses)
    b = new()
    b.load_state_dict(roundtrip(a.state_dict()))
    assert b.metrics()["num_nonfinite_losses"] == 3
    x, _y = next(iter(b))
    losses = oracle_loss(x)
    losses[0] = float("inf")
    b.weighted_loss(losses)
    assert b.metrics()["num_nonfinite_losses"] == 4


def test_version_1s_data_parallel_fields_are_converted():
    meta, old = version_1_state()

    def new():
        ds = IdDataset(meta["samples"])
        return EpochSiftingDataloader(meta["config"], DataLoader(ds, batch_size=meta["batch_size"]), meta["num_epochs"])

    ids = torch.arange(meta["samples"])
    mine, carried = ids % 2 == 0, ids % 3 == 0
    b = new()
    b.load_state_dict({**old, "mine": mine, "carried": carried})
    assert torch.equal(b.shares.mine, mine) and torch.equal(b.shares.carried, carried)
    saved = b.state_dict()["shares"]
    assert torch.equal(saved["mine"], mine) and torch.equal(saved["carried"], carried)
    with pytest.raises(ValueError, match="world_size=2"):
        new().load_state_dict({**old, "world_size": 2})
    with pytest.raises(ValueError, match="rank=1"):
        new().load_state_dict({**old, "rank": 1})
