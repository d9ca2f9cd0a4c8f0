"""Pairing in the loops users write: a batch left out (``skip_batch()``, or the clear error
at the next yield without it), the look-ahead of Lightning-like and gradient-accumulation
loops, ``lookahead=``, micro-batches whose values sum to the batch's, and a loss tensor
changed in place after ``weighted_loss``."""

import logging

import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader, LossOutputException
from neuron_sift.integrations.schedules import ExactLengthLoader
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, ids_of, oracle, oracle_loss


def make(n=64, batch=8, epochs=3, cfg=None, **kw):
    dl = DataLoader(IdDataset(n), batch_size=batch, shuffle=True)
    return EpochSiftingDataloader({"seed": 3, **PRUNE_FROM_THE_START, **(cfg or {})}, dl, num_epochs=epochs, **kw)


def poisoned(x, bad):
    """Oracle losses (they encode the sample id), NaN when the batch holds a ``bad`` id."""
    losses = oracle_loss(x)
    if set(ids_of(x)) & bad:
        losses = losses * float("nan")
    return losses


def assert_no_wrong_score(loader, trained):
    """Every recorded score is its own sample's oracle loss; samples never trained have none."""
    scores = loader.tables.snapshot()
    for i in range(loader.n):
        if i in trained:
            assert torch.isclose(scores[i], oracle(torch.tensor([i]))[0]), i
        else:
            assert torch.isnan(scores[i]), i


def test_the_skip_loop_with_skip_batch_pairs_every_score_with_its_own_sample():
    loader = make()
    bad = {5, 17, 40}
    trained, skipped = set(), 0
    for _ in range(3):
        for x, _y in loader:
            losses = poisoned(x, bad)
            if not torch.isfinite(losses).all():
                loader.skip_batch()
                skipped += 1
                continue
            loader.weighted_loss(losses)
            trained |= set(ids_of(x))
    assert skipped >= 3
    assert_no_wrong_score(loader, trained)
    m = loader.metrics()
    assert m["batches_skipped"] == loader.counts["batches_skipped"] == skipped
    assert m["unpaired_batches"] == 0 and m["num_nonfinite_losses"] == 0
    assert loader.epoch == 3  # a skipped batch does not stall or extend an epoch


def test_the_skip_loop_without_skip_batch_raises_at_the_next_yield_before_any_misattribution():
    loader = make()
    bad = set(loader.start_epoch().order[16:24].tolist())  # the samples of the epoch's batch 2
    trained = set()
    with pytest.raises(LossOutputException, match=r"batch 2 of epoch 0 \(0-based\) was yielded but got no loss") as e:
        for x, _y in loader:
            losses = poisoned(x, bad)
            if not torch.isfinite(losses).all():
                continue  # the common pattern, without skip_batch()
            loader.weighted_loss(losses)
            trained |= set(ids_of(x))
    assert "loader.skip_batch() before `continue`" in str(e.value)
    assert trained == set(loader.plan.order[:16].tolist())
    assert_no_wrong_score(loader, trained)


def lightning_like(loader):
    """Lightning's fetcher: one batch pulled ahead of the one being trained."""
    it = iter(loader)
    try:
        ahead = next(it)
    except StopIteration:
        return
    for batch in it:
        yield ahead
        ahead = batch
    yield ahead


@pytest.mark.parametrize("use_skip", [True, False])
def test_a_one_batch_prefetch_is_learned_and_a_skip_in_it_is_caught(use_skip):
    loader = make()
    bad = {30}
    trained = set()

    def run():
        for _ in range(3):
            for x, _y in lightning_like(loader):
                losses = poisoned(x, bad)
                if not torch.isfinite(losses).all():
                    if use_skip:
                        loader.skip_batch()
                    continue
                loader.weighted_loss(losses)
                trained.update(ids_of(x))

    if use_skip:
        run()
        assert loader.counts["batches_skipped"] == 3
    else:
        with pytest.raises(LossOutputException, match="holds at most 2 batch"):
            run()
    assert_no_wrong_score(loader, trained)


def test_gradient_accumulation_groups_across_epochs_never_trip_the_check():
    """The Trainer pulls ``k`` batches per optimizer step through ``ExactLengthLoader`` (batches of
    the previous epoch still waiting); the last group of a Trainer epoch is short, and may be
    the first pull of a new loader epoch: the look-ahead learned before stays."""
    for per_epoch in range(5, 12):
        loader = make(n=100, batch=8, epochs=5, cfg={"kept_share": 0.5})
        stream = ExactLengthLoader(loader, per_epoch)
        trained = set()
        for _ in range(4):
            it = iter(stream)
            while True:
                group = [b for _, b in zip(range(4), it)]
                if not group:
                    break
                for x, _y in group:
                    loader.weighted_loss(oracle_loss(x))
                    trained.update(ids_of(x))
        assert loader.metrics()["unpaired_batches"] == 0
        assert_no_wrong_score(loader, trained)


@pytest.mark.parametrize("given", [None, 3])
def test_a_given_lookahead_bounds_a_varying_prefetch(given):
    """A loop that holds one batch at first and three later (an outer prefetcher warming
    up) needs ``lookahead=``; with it, a fourth batch without losses is still caught."""
    loader = make(lookahead=given)
    it = iter(loader)
    x, _y = next(it)
    loader.weighted_loss(oracle_loss(x))  # the look-ahead learned so far: 1
    held = [next(it)]
    if given is None:
        with pytest.raises(LossOutputException, match="holds at most 1 batch"):
            next(it)
        return
    held += [next(it), next(it)]  # three batches without their losses: allowed
    loader.weighted_loss(oracle_loss(held.pop(0)[0]))
    held.append(next(it))
    with pytest.raises(LossOutputException, match="batch 2 of epoch 0.*holds at most 3 batch"):
        next(it)  # a fourth


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_lookahead_is_validated(bad):
    with pytest.raises(ValueError, match="lookahead must be an int >= 1"):
        make(lookahead=bad)


def test_skip_batch_errors_and_micro_batches():
    loader = make()
    with pytest.raises(LossOutputException, match="skip_batch\\(\\) was called but no yielded batch is waiting"):
        loader.skip_batch()
    it = iter(loader)
    x, _y = next(it)
    loader.weighted_loss(oracle_loss(x[:3]), partial=True)  # part of the batch, then the rest left out
    loader.skip_batch()
    assert loader.progress.position == 1 and loader.counts["batches_recorded"] == 0
    x2, _y = next(it)  # no error: the skipped batch is no longer waiting
    loader.weighted_loss(oracle_loss(x2))
    assert_no_wrong_score(loader, set(ids_of(x[:3])) | set(ids_of(x2)))


def test_a_checkpoint_after_a_skip_does_not_replay_the_skipped_batch():
    a = make()
    it = iter(a)
    x, _y = next(it)
    a.skip_batch()
    x2, _y = next(it)
    a.weighted_loss(oracle_loss(x2))
    c = make()
    c.load_state_dict(a.state_dict())
    assert len(c) == len(a.progress.batches) - 2
    rest = [ids_of(x) for x, _y in c if c.weighted_loss(oracle_loss(x)) is not None]
    assert ids_of(x) not in rest and ids_of(x2) not in rest
    assert len(rest) == len(a.progress.batches) - 2


@pytest.mark.parametrize("epoch_kind", ["warmup", "sift"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_micro_batch_values_sum_to_the_batch_value(epoch_kind, dtype):
    """Parts of unequal sizes: their returned values (and gradients) add up to what the whole
    batch returns."""
    whole, parts = make(cfg={"kept_share": 0.5}), make(cfg={"kept_share": 0.5})
    for run in (whole, parts):
        if epoch_kind == "sift":
            for x, _y in run:
                run.weighted_loss(oracle_loss(x))
    for (xa, _), (xb, _) in zip(whole, parts):
        la = oracle_loss(xa).to(dtype).requires_grad_()
        lb = oracle_loss(xb).to(dtype).requires_grad_()
        va = whole.weighted_loss(la)
        sizes = [1, 2, lb.shape[0] - 3]
        vb = sum(parts.weighted_loss(p, partial=True) for p in torch.split(lb, sizes))
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
        assert torch.allclose(va.double(), vb.double(), rtol=tol), (va, vb)
        va.backward()
        vb.backward()
        assert torch.allclose(la.grad.double(), lb.grad.double(), rtol=tol)
    if epoch_kind == "sift":
        assert not torch.equal(whole.plan.weights, torch.ones_like(whole.plan.weights))


@pytest.mark.xla
def test_micro_batch_values_sum_to_the_batch_value_with_tables_on_an_xla_device():
    import torch_xla

    device = torch_xla.device()
    whole, parts = make(cfg={"kept_share": 0.5}), make(cfg={"kept_share": 0.5})
    for run in (whole, parts):
        for x, _y in run:  # the warm-up: scores for the sifted epoch to plan from
            run.weighted_loss(oracle_loss(x).to(device))
    for (xa, _), (xb, _) in zip(whole, parts):
        va = whole.weighted_loss(oracle_loss(xa).to(device))
        lb = oracle_loss(xb).to(device)
        vb = sum(parts.weighted_loss(p, partial=True) for p in torch.split(lb, [3, lb.shape[0] - 3]))
        assert torch.allclose(va.cpu(), vb.cpu(), rtol=1e-6)
    assert whole.tables.on_device and parts.tables.on_device
    assert not torch.equal(whole.plan.weights, torch.ones_like(whole.plan.weights))


def test_a_loss_changed_in_place_after_weighted_loss_is_detected_once(caplog):
    loader = make()
    with caplog.at_level(logging.WARNING, logger="neuron_sift.epoch.loader"):
        for x, _y in loader:
            loader.weighted_loss(oracle_loss(x))
        loader.metrics()
        assert "changed in place" not in caplog.text
        for _ in range(2):
            for x, _y in loader:
                losses = oracle_loss(x)
                loader.weighted_loss(losses)
                losses.mul_(2.0)  # after the call: on the host the scores are written later
            loader.metrics()  # writes the pending scores
    assert caplog.text.count("changed in place") == 1


@pytest.mark.parametrize("wrap", [iter, lightning_like], ids=["plain", "lightning"])
def test_the_first_batch_of_a_later_epoch_left_out_is_caught(wrap):
    """Once the look-ahead is known, a new epoch does not re-learn it: leaving out its first
    batch is caught like any other."""
    loader = make()
    trained = set()
    for x, _y in wrap(loader):
        loader.weighted_loss(oracle_loss(x))
        trained.update(ids_of(x))
    with pytest.raises(LossOutputException, match="batch 0 of epoch 1"):
        for i, (x, _y) in enumerate(wrap(loader)):
            if i == 0:
                continue
            loader.weighted_loss(oracle_loss(x))
            trained.update(ids_of(x))
    assert_no_wrong_score(loader, trained)


def test_a_resume_into_a_one_batch_rest_learns_the_look_ahead_in_the_next_epoch():
    """Lightning resumed with one batch left in the epoch holds one batch there (there is no
    second to prefetch), then two in the next epoch: not a skipped batch."""
    a = make()
    it = iter(a)
    for _ in range(len(a) - 1):
        x, _y = next(it)
        a.weighted_loss(oracle_loss(x))
    b = make()
    b.load_state_dict(a.state_dict())
    trained = set()
    for _ in range(2):
        for x, _y in lightning_like(b):
            b.weighted_loss(oracle_loss(x))
            trained.update(ids_of(x))
    assert b.epoch == 2 and b.metrics()["unpaired_batches"] == 0
    with pytest.raises(LossOutputException, match="holds at most 2 batch"):
        for i, (x, _y) in enumerate(lightning_like(b)):
            if i != 1:
                b.weighted_loss(oracle_loss(x))
