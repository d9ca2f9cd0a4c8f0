"""Epoch boundaries: a loop resumed at any cut point (after every batch, after every epoch)
takes exactly the uninterrupted run's steps; a peek does not spend an epoch; an epoch left
early is ended with a warning; with ``drop_last`` the record reports what was trained; one
epoch numbering everywhere."""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle_loss

N, B, E = 100, 16, 4
CFG = {**PRUNE_FROM_THE_START, "seed": 1, "kept_share": 0.5, "anneal_fraction": 0.25}


def new_run(drop_last=False, cfg=CFG, n=N):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dl = DataLoader(IdDataset(n), batch_size=B, shuffle=True, drop_last=drop_last)
    return model, opt, EpochSiftingDataloader(cfg, dl, num_epochs=E)


def train(model, opt, loader, start_epoch, checkpoints=None):
    """The user's loop; with ``checkpoints``, a checkpoint after every batch (saving the
    epoch it is in) and after every epoch (saving the next one). Returns the ids per step."""
    steps = []

    def save(epoch):
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "loader": loader.state_dict(), "epoch": epoch}
        checkpoints.append((len(steps), roundtrip(state)))

    for epoch in range(start_epoch, E):
        for x, y in loader:
            per_sample = F.cross_entropy(model(x / N), y, reduction="none")
            loss = loader.weighted_loss(per_sample)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps.append(ids_of(x))
            if checkpoints is not None:
                save(epoch)
        if checkpoints is not None:
            save(epoch + 1)
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_loop_resumed_at_any_cut_takes_exactly_the_uninterrupted_runs_steps(drop_last):
    model, opt, loader = new_run(drop_last)
    planned = loader.planned_steps()
    checkpoints = []
    full = train(model, opt, loader, 0, checkpoints)
    assert len(full) == planned
    final = [p.detach().clone() for p in model.parameters()]
    assert len(checkpoints) == len(full) + E
    for done, ckpt in checkpoints:
        model, opt, loader = new_run(drop_last)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["loader"])
        left = loader.planned_steps()
        if ckpt["epoch"] < E:
            assert left == loader.planned_steps(E - ckpt["epoch"])  # the epoch you are in counted first
        rest = train(model, opt, loader, ckpt["epoch"])
        assert full[:done] + rest == full, (done, ckpt["epoch"])
        assert left == len(rest), (done, ckpt["epoch"])
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), final))


def test_after_the_last_batch_the_epoch_is_finished_but_open_until_its_iteration_ends():
    _, _, loader = new_run()
    it = iter(loader)
    for x, _y in it:
        loader.weighted_loss(oracle_loss(x))
        if loader.progress.position == len(loader.progress.batches):
            break
    m = loader.metrics()
    assert m["epoch"] == 0 and m["epoch_finished"]
    state = loader.state_dict()
    assert state["in_progress"]  # the loop has not ended the iteration: a resume takes its empty rest
    resumed = new_run()[2]
    resumed.load_state_dict(roundtrip(state))
    assert len(resumed) == 0 and resumed.planned_steps(1) == 0
    assert list(resumed) == [] and resumed.epoch == 1
    assert resumed.planned_steps() == loader.planned_steps()
    assert next(it, None) is None  # the original's iteration ends: now the next iter() plans epoch 1
    assert not loader.state_dict()["in_progress"]


def run_epochs(loader, epochs):
    seen = []
    for _ in range(epochs):
        for x, _y in loader:
            seen.append(ids_of(x))
            loader.weighted_loss(oracle_loss(x))
    return seen


def comparable(loader):
    """The loader's state, without the count of yields (a peek is a yield)."""
    state = loader.state_dict()
    state["pairing"].pop("batches_yielded")
    return state


def assert_same_state(a, b):
    sa, sb = comparable(a), comparable(b)
    for part in ("progress", "pairing", "guard"):
        assert str(sa[part]) == str(sb[part]), part
    assert torch.equal(sa["tables"]["scores"].nan_to_num(-1), sb["tables"]["scores"].nan_to_num(-1))
    assert [{k: v for k, v in h.items() if k != "planning_seconds"} for h in sa["history"]["epochs"]] == [
        {k: v for k, v in h.items() if k != "planning_seconds"} for h in sb["history"]["epochs"]
    ]


@pytest.mark.parametrize(
    "cfg", [CFG, {**PRUNE_FROM_THE_START, "seed": 1, "policy": "below_mean"}], ids=["budget", "below_mean"]
)
def test_a_peek_does_not_change_the_run(cfg, caplog):
    _, _, plain = new_run(cfg=cfg)
    expected = run_epochs(plain, E)
    _, _, peeked = new_run(cfg=cfg)
    before = (peeked.planned_steps(), len(peeked))
    x, _y = next(iter(peeked))  # shape inference
    assert (peeked.planned_steps(), len(peeked)) == before
    with caplog.at_level(logging.WARNING, logger="neuron_sift.epoch.loader"):
        seen = run_epochs(peeked, 1)
        next(iter(peeked))  # a peek between epochs
        seen += run_epochs(peeked, E - 1)
    assert ids_of(x) == seen[0]
    assert seen == expected
    assert peeked.epoch == plain.epoch == E  # num_epochs respected
    assert peeked.metrics()["unpaired_batches"] == 0
    assert caplog.text == ""  # neither "never got their losses" nor "past num_epochs"
    assert_same_state(peeked, plain)


def test_a_peek_after_a_checkpoint_load_does_not_change_the_resume():
    _, _, a = new_run()
    run_epochs(a, 1)
    it = iter(a)
    for _ in range(2):
        x, _y = next(it)
        a.weighted_loss(oracle_loss(x))
    state = roundtrip(a.state_dict())
    b, c = new_run()[2], new_run()[2]
    b.load_state_dict(state)
    c.load_state_dict(state)
    x, _y = next(iter(c))
    assert c.resuming and len(c) == len(b)
    expected = run_epochs(b, E - 1)
    seen = run_epochs(c, E - 1)
    assert ids_of(x) == seen[0] and seen == expected
    assert_same_state(b, c)


class Failing(IdDataset):
    def __init__(self, n, bad):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if int(i) == self.bad:
            raise ValueError(f"corrupt sample {int(i)}")
        return super().__getitem__(i)


@pytest.mark.parametrize("how", ["break", "error"])
def test_an_epoch_left_after_some_losses_ends_with_a_warning(how, caplog):
    ds = Failing(N, bad=-1)
    loader = EpochSiftingDataloader(CFG, DataLoader(ds, batch_size=B, shuffle=True), num_epochs=E)
    plan = loader.start_epoch()
    ds.bad = int(plan.order[3 * B])  # the epoch's batch 3 fails to load
    try:
        for i, (x, _y) in enumerate(loader):
            loader.weighted_loss(oracle_loss(x))
            if how == "break" and i == 2:
                break
    except ValueError as exc:
        assert how == "error" and "corrupt sample" in str(exc)
    assert loader.progress.position == 3
    with caplog.at_level(logging.WARNING, logger="neuron_sift.epoch.loader"):
        nxt = iter(loader)
        x, _y = next(nxt)
    assert "epoch 0 (0-based) was left after 3 of its 7 batches" in caplog.text
    assert "the other 4 were never trained" in caplog.text
    assert loader.epoch == 2 and loader.plan.epoch == 1
    assert loader.metrics()["unpaired_batches"] == 0


def test_with_drop_last_the_record_reports_the_trained_samples():
    _, _, loader = new_run(drop_last=True)
    trained = []
    for _ in range(2):
        ids = [i for b in run_epochs(loader, 1) for i in b]
        trained.append(len(ids))
    warm, sift = loader.history
    assert trained == [96, 48]  # 100 -> 6 batches of 16; 50 kept -> 3 batches
    assert (warm["kept"], warm["planned"], sift["kept"], sift["planned"]) == (96, 100, 48, 50)
    m = loader.metrics()
    assert m["observed_kept_share"] == sift["observed_kept_share"] == 0.48
    assert m["epochs"][1]["observed_kept_share"] == 0.48 and "kept_share" not in m  # one name (0.5.0's alias gone)
    assert m["epochs"][1]["kept"] == 48


def test_one_epoch_numbering_in_history_metrics_and_logs(caplog):
    _, _, loader = new_run()
    assert loader.metrics()["epoch"] is None and not loader.metrics()["epoch_finished"]
    with caplog.at_level(logging.INFO, logger="neuron_sift.epoch.loader"):
        for e in range(E + 1):
            run_epochs(loader, 1)
            m = loader.metrics()
            assert m["epoch"] == loader.history[-1]["epoch"] == loader.plan.epoch == e
            assert m["epochs_started"] == e + 1 and m["epoch_finished"]
    assert "epoch 0 (warmup): trains 100 of 100 samples" in caplog.text
    assert f"epoch {E} (0-based) is past num_epochs={E}" in caplog.text
