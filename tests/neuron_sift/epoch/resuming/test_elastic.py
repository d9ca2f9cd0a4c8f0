"""Resuming an epoch-level run at another world size (issue 24, items 1 and 3), under torchrun
and gloo: a run checkpointed 3 batches into a sifted epoch at ``W`` ranks resumes at ``W'``
from every rank's checkpoint, with either score table. Within that epoch nothing is trained
twice and nothing is lost; every rank runs the same number of steps; later epochs are
planned for ``W'`` ranks (budget counts in multiples of ``W'``, disjoint shares); every
sample's score when the next epoch starts is the last loss recorded for it, on whichever
rank and world size it trained (under a sharded table: at its owner, after the hosted
samples' scores were handed over). Under a sharded table each rank plans only samples it
owns and its checkpoint holds no tensor larger than its share."""

import json
import math

import pytest

from tests.neuron_sift import torchrun
from tests.neuron_sift.epoch.elastic_worker import EPOCHS, SAMPLES, SAVE_IN_EPOCH
from tests.neuron_sift.epoch.helpers import worker

WORKER = worker("elastic_worker.py")


def phase(tmp_path, world, name, table, *args):
    out = torchrun.launch(WORKER, tmp_path, world, "--phase", name, "--score-table", table, *args, tag=name)
    return [json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(world)]


def trained(runs, epoch):
    return [i for r in runs for i in r["ids"].get(str(epoch), [])]


def global_plan(runs, epoch, table):
    """The epoch's plan over all ranks: each rank's under a sharded table (disjoint, owned)."""
    plans = [r["plans"][str(epoch)] for r in runs]
    if table == "replicated":
        assert all(p == plans[0] for p in plans)  # one global plan
        return plans[0]
    for rank, p in enumerate(plans):
        assert all(i % len(runs) == rank for i in p)  # a rank plans only the samples it owns
        assert len(p) == len(plans[0])  # equal shares
    whole = [i for p in plans for i in p]
    assert len(set(whole)) == len(whole)
    return whole


@pytest.mark.slow
@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize("before, after", [(4, 2), (2, 3), (1, 2)])
def test_resume_at_another_world_size(tmp_path, before, after, table):
    saved = phase(tmp_path, before, "save", table)
    resumed = phase(tmp_path, after, "load", table, "--saved-world", str(before))
    e = SAVE_IN_EPOCH
    plan = global_plan(saved, e, table)
    done, rest = trained(saved, e), trained(resumed, e)
    assert len(done) == 3 * 8 * before  # 3 batches of 8 on every old rank
    assert len(set(done)) == len(done) and len(set(rest)) == len(rest)
    assert not set(done) & set(rest)  # nothing trained twice
    assert sorted(done + rest) == sorted(plan)  # nothing lost
    assert len(plan) == (round(0.5 * SAMPLES) // before) * before  # the epoch was planned for the old ranks
    for epoch in range(e, EPOCHS):
        assert len({r["steps"][str(epoch)] for r in resumed}) == 1, epoch  # lockstep
    for epoch in range(e + 1, EPOCHS):
        ids = trained(resumed, epoch)
        later = global_plan(resumed, epoch, table)
        assert len(set(ids)) == len(ids) and sorted(ids) == sorted(later)
        whole = SAMPLES if epoch == EPOCHS - 1 else round(0.5 * SAMPLES)
        assert len(later) == (whole // after) * after  # planned for the new ranks
    assert all(r["params"] == resumed[0]["params"] for r in resumed)
    last: dict[str, tuple[int, float]] = {}
    for r in saved + resumed:  # the old ranks' losses, then the new ones' (epoch e's rest and after)
        for i, (epoch, loss) in r["last_loss"].items():
            if epoch <= e and (i not in last or epoch >= last[i][0]):
                last[i] = (epoch, loss)
    held = {i: v for r in resumed for i, v in r["held"].items()}
    assert len(held) == SAMPLES  # every sample's score is held by some rank
    assert {i for i, v in held.items() if not math.isnan(v)} == set(last)  # the trained ones scored, no others
    assert all(held[i] == last[i][1] for i in last)  # each score is its sample's last loss
    if table == "sharded":
        assert all(r["largest_tensor"] <= math.ceil(SAMPLES / before) for r in saved)
