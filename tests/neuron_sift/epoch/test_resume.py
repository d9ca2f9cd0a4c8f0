"""Exact resume at any batch of any epoch: the remaining batches, the scores and the draws
are those of the uninterrupted run; the checkpoint loads with weights_only=True."""

import io

import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.epoch.helpers import IdDataset, Prefetcher, ids_of, oracle_loss

EPOCHS = 6
CFGS = [
    {"seed": 5},
    {"seed": 5, "policy": "below_mean", "kept_share": 0.5},
    {"seed": 5, "noise_guard_epochs": 1, "noise_guard_quantile": 0.8},
]


def new_loader(cfg, workers=0):
    ds = IdDataset(203)
    kw = {"num_workers": workers, "persistent_workers": workers > 0} if workers else {}
    return EpochSiftingDataloader(cfg, DataLoader(ds, batch_size=16, shuffle=True, **kw), num_epochs=EPOCHS)


def train(loader, epochs, stop_after=None, wrap=None):
    """Oracle-loss loop; returns (ids per batch, stopped) and stops after ``stop_after`` batches."""
    seen = []
    for _ in range(epochs):
        source = wrap(loader) if wrap else loader
        for x, _y in source:
            seen.append(ids_of(x))
            loader.weighted_loss(oracle_loss(x))
            if stop_after is not None and len(seen) == stop_after:
                return seen, True
    return seen, False


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("cfg", CFGS, ids=["percentile", "below_mean-budget", "guard"])
@pytest.mark.parametrize("stop", [1, 13, 14, 22, 30])
def test_resume_at_any_batch_replays_the_uninterrupted_run(cfg, stop):
    full, _ = train(new_loader(cfg), EPOCHS)
    reference = new_loader(cfg)
    train(reference, EPOCHS)
    a = new_loader(cfg)
    first, stopped = train(a, EPOCHS, stop_after=stop)
    assert stopped
    state = roundtrip(a.state_dict())
    epoch_of_stop = a.epoch
    b = new_loader(cfg)
    b.load_state_dict(state)
    rest = []
    in_progress = state["in_progress"]
    if in_progress:
        for x, _y in b:  # the rest of the interrupted epoch
            rest.append(ids_of(x))
            b.weighted_loss(oracle_loss(x))
    more, _ = train(b, EPOCHS - epoch_of_stop)
    assert first + rest + more == full
    assert torch.equal(b.tables.snapshot().isnan(), reference.tables.snapshot().isnan())
    assert torch.allclose(b.tables.snapshot().nan_to_num(), reference.tables.snapshot().nan_to_num())
    assert [h["kept"] for h in b.history] == [h["kept"] for h in reference.history]


def test_resume_with_batches_prefetched_but_not_trained():
    """Batches a prefetching wrapper pulled but the loop never trained are yielded again."""
    cfg = {"seed": 2}
    full, _ = train(new_loader(cfg), 3)
    a = new_loader(cfg)
    first, _ = train(a, 3, stop_after=20, wrap=lambda l: Prefetcher(l, depth=4))
    state = roundtrip(a.state_dict())
    b = new_loader(cfg)
    b.load_state_dict(state)
    rest = []
    for x, _y in b:
        rest.append(ids_of(x))
        b.weighted_loss(oracle_loss(x))
    more, _ = train(b, 3 - b.epoch)
    assert first + rest + more == full


def test_resume_with_workers():
    cfg = {"seed": 4, "kept_share": 0.3}
    full, _ = train(new_loader(cfg, workers=2), 3)
    a = new_loader(cfg, workers=2)
    first, _ = train(a, 3, stop_after=16)
    b = new_loader(cfg, workers=2)
    b.load_state_dict(roundtrip(a.state_dict()))
    rest = []
    for x, _y in b:  # the rest of the interrupted epoch
        rest.append(ids_of(x))
        b.weighted_loss(oracle_loss(x))
    more, _ = train(b, 3 - b.epoch)
    assert first + rest + more == full


def test_a_state_of_another_setup_is_refused():
    a = new_loader({"seed": 1})
    train(a, 1)
    state = a.state_dict()
    with pytest.raises(ValueError, match="policy"):
        new_loader({"seed": 1, "policy": "below_mean"}).load_state_dict(state)
    other = EpochSiftingDataloader({}, DataLoader(IdDataset(50), batch_size=16))
    with pytest.raises(ValueError, match="n="):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="not an EpochSiftingDataloader state"):
        a.load_state_dict({"version": 1})


def test_an_iterator_started_before_loading_is_void():
    a = new_loader({"seed": 1})
    it = iter(a)
    next(it)
    a.load_state_dict(roundtrip(new_loader({"seed": 1}).state_dict()))
    with pytest.raises(RuntimeError, match="no longer valid"):
        next(it)
