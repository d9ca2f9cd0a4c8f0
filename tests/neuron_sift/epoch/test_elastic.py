"""Resuming an epoch-level run at another world size (issue 24, item 3), under torchrun and
gloo: a run checkpointed 3 batches into a sifted epoch at ``W`` ranks resumes at ``W'``
from every rank's checkpoint. Within that epoch nothing is trained twice and nothing is
lost; every rank runs the same number of steps; later epochs are planned for ``W'`` ranks
(budget counts in multiples of ``W'``, disjoint shares)."""

import json

import pytest

from tests.neuron_sift import torchrun
from tests.neuron_sift.epoch.elastic_worker import EPOCHS, SAMPLES, SAVE_IN_EPOCH

WORKER = __file__.replace("test_elastic.py", "elastic_worker.py")


def phase(tmp_path, world, name, *args):
    out = torchrun.launch(WORKER, tmp_path, world, "--phase", name, *args, tag=name)
    return [json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(world)]


def trained(runs, epoch):
    return [i for r in runs for i in r["ids"].get(str(epoch), [])]


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(4, 2), (2, 3), (1, 2)])
def test_resume_at_another_world_size(tmp_path, before, after):
    saved = phase(tmp_path, before, "save")
    resumed = phase(tmp_path, after, "load", "--saved-world", str(before))
    e = str(SAVE_IN_EPOCH)
    plan = saved[0]["plans"][e]
    assert all(r["plans"][e] == plan for r in saved)  # one global plan
    done, rest = trained(saved, SAVE_IN_EPOCH), trained(resumed, SAVE_IN_EPOCH)
    assert len(done) == 3 * 8 * before  # 3 batches of 8 on every old rank
    assert len(set(done)) == len(done) and len(set(rest)) == len(rest)
    assert not set(done) & set(rest)  # nothing trained twice
    assert sorted(done + rest) == sorted(plan)  # nothing lost
    assert len(plan) == (round(0.5 * SAMPLES) // before) * before  # the epoch was planned for the old ranks
    for epoch in range(SAVE_IN_EPOCH, EPOCHS):
        assert len({r["steps"][str(epoch)] for r in resumed}) == 1, epoch  # lockstep
    for epoch in range(SAVE_IN_EPOCH + 1, EPOCHS):
        ids = trained(resumed, epoch)
        later = resumed[0]["plans"][str(epoch)]
        assert all(r["plans"][str(epoch)] == later for r in resumed)
        assert len(set(ids)) == len(ids) and sorted(ids) == sorted(later)
        whole = SAMPLES if epoch == EPOCHS - 1 else round(0.5 * SAMPLES)
        assert len(later) == (whole // after) * after  # planned for the new ranks
    assert all(r["params"] == resumed[0]["params"] for r in resumed)
