"""The epoch loader's checkpoint as a composition of its parts' states: named parts plus a
version; a state written by the version-1 code (one flat dict) still loads and resumes
exactly; other versions and kinds are refused with a message naming them."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.resuming.state_layout import PARTS, STATE_VERSION
from neuron_sift.shared.checkpoints import CHECKSUM, content_checksum
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.epoch.helpers import (
    PRUNE_FROM_THE_START,
    IdDataset,
    Prefetcher,
    ids_of,
    oracle,
    oracle_loss,
    version_1_state,
)


def loader_for(meta):
    ds = IdDataset(meta["samples"])
    dl = DataLoader(ds, batch_size=meta["batch_size"], shuffle=True)
    return EpochSiftingDataloader(meta["config"], dl, num_epochs=meta["num_epochs"])


def train_to_the_end(loader, num_epochs):
    seen = []
    while True:
        for x, _y in loader:
            seen.append(ids_of(x))
            loader.weighted_loss(oracle_loss(x))
        if loader.epoch >= num_epochs:
            return seen


def test_a_version_1_state_resumes_exactly():
    """Written mid-epoch of a sifted epoch by the code before the split (noise guard on,
    batches pulled ahead by a prefetcher): the rest of the run, the kept counts and the
    final scores are those of the uninterrupted run of that code."""
    meta, state = version_1_state()
    assert state["version"] == 1 and state["in_progress"]
    b = loader_for(meta)
    b.load_state_dict(state)
    assert b.resuming and b.epoch == state["epochs_started"]
    assert len(b) == len(b.progress.batches) - state["position"]
    assert b.counts == {**state["counts"], "batches_skipped": 0}  # version 1 had no skip_batch()
    assert torch.equal(b.guard.streak, state["streak"])
    rest = train_to_the_end(b, meta["num_epochs"])
    assert rest == meta["rest"]
    assert [h["kept"] for h in b.history] == meta["kept"]
    old = state["history"]  # version 1's entries name the measured share kept_share: read into observed_kept_share
    assert [h["observed_kept_share"] for h in b.history[: len(old)]] == [h["kept_share"] for h in old]
    assert all("kept_share" not in h for h in b.history)  # the old name is not kept in the record
    reported = b.metrics()["epochs"]  # nor reported (0.5.0's alias is gone)
    assert [e["observed_kept_share"] for e in reported] == [h["observed_kept_share"] for h in b.history]
    assert all("kept_share" not in e for e in reported)
    scores = b.tables.snapshot()
    reference = torch.tensor(meta["final_scores"])
    assert torch.equal(scores.isnan(), reference.isnan())
    assert torch.equal(scores.nan_to_num(), reference.nan_to_num())


def test_a_converted_version_1_state_is_saved_in_the_current_layout():
    meta, state = version_1_state()
    b = loader_for(meta)
    b.load_state_dict(state)
    now = roundtrip(b.state_dict())
    assert now["version"] == STATE_VERSION and now["kind"] == "EpochSiftingDataloader"
    assert now["planner"]["seed"] == state["seed"]
    assert now["progress"]["position"] == state["position"]
    assert torch.equal(now["progress"]["plan"]["order"], state["plan"]["order"])
    assert now["pairing"]["dropped_batches"] == 0
    c = loader_for(meta)
    c.load_state_dict(now)
    assert train_to_the_end(c, meta["num_epochs"]) == meta["rest"]


def test_the_state_is_the_parts_states_under_their_names():
    """Each part's state under its name, holding what the run did: a checkpoint taken one
    batch into the second sifted epoch (noise guard on) names its position, plan, scores,
    streaks, counts and record."""
    ds = IdDataset(60)
    a = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 2, "noise_guard_epochs": 1}, DataLoader(ds, batch_size=8), num_epochs=4
    )
    trained, batches = [], 0
    for _ in range(2):
        for x, _y in a:
            a.weighted_loss(oracle_loss(x))
            trained += ids_of(x)
            batches += 1
    it = iter(a)
    x, _y = next(it)
    a.weighted_loss(oracle_loss(x))
    current = ids_of(x)
    state = roundtrip(a.state_dict())  # plain values and CPU tensors only
    assert set(state) == {"version", "kind", "checksum", "in_progress", *PARTS}
    assert state["checksum"] == content_checksum(state)  # of the content, written with it
    assert state["in_progress"] is True and state["progress"]["in_progress"] is True
    assert (state["planner"]["seed"], state["planner"]["n"], state["planner"]["batch_size"]) == (2, 60, 8)
    progress, plan = state["progress"], state["progress"]["plan"]
    assert (progress["epochs_started"], progress["position"], plan["epoch"], plan["kind"]) == (3, 1, 2, "sift")
    assert plan["order"][: len(current)].tolist() == current
    scored = torch.tensor(sorted(set(trained + current)))
    assert torch.allclose(state["tables"]["scores"][scored], oracle(scored))
    assert state["tables"]["scores"].isnan().sum() == 60 - len(scored) and state["tables"]["nonfinite"] == 0
    flagged = state["guard"]["streak"] >= 1  # noise_guard_epochs=1: these are left out of the plan
    assert int(flagged.sum()) == plan["excluded"] > 0 and not set(flagged.nonzero().flatten().tolist()) & set(
        plan["order"].tolist()
    )
    in_plan = torch.zeros(60, dtype=torch.bool)
    in_plan[plan["order"]] = True
    assert torch.equal(state["shares"]["mine"], in_plan) and not state["shares"]["carried"].any()
    assert state["pairing"]["losses_recorded"] == len(trained) + len(current)
    assert state["pairing"]["batches_recorded"] == state["pairing"]["batches_yielded"] == batches + 1
    assert [h["kind"] for h in state["history"]["epochs"]] == ["warmup", "sift", "sift"]
    assert state["history"]["epochs"][-1]["kept"] == len(plan["order"]) and state["history"]["epochs"][0]["kept"] == 60
    assert set(state["planner"]) == {
        "seed",
        "n",
        "batch_size",
        "world_size",
        "rank",
        "policy",
        "kept_share",
        "max_pruned_share",
        "reference",
    }
    assert set(state["pairing"]) == {
        "losses_recorded",
        "batches_recorded",
        "batches_skipped",
        "batches_yielded",
        "dropped_batches",
    }


def test_unpaired_batches_are_counted_across_a_resume():
    ds = IdDataset(64)
    a = EpochSiftingDataloader({**PRUNE_FROM_THE_START, "seed": 1}, DataLoader(ds, batch_size=16), num_epochs=3)
    for i, (x, _y) in enumerate(a):
        if i != 3:  # the epoch's last batch gets no loss (an earlier one would raise at the next yield)
            a.weighted_loss(oracle_loss(x))
    it = iter(a)  # the next epoch: the batch without its loss is counted as dropped
    x, y = next(it)
    a.weighted_loss(oracle_loss(x))
    b = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 1}, DataLoader(IdDataset(64), batch_size=16), num_epochs=3
    )
    b.load_state_dict(roundtrip(a.state_dict()))
    assert b.metrics()["unpaired_batches"] == a.metrics()["unpaired_batches"] == 1
    assert b.counts == a.counts


@pytest.mark.parametrize("version", [0, 4, "2", None])
def test_other_versions_are_refused_naming_theirs_and_the_supported_one(version):
    a = EpochSiftingDataloader(
        {**PRUNE_FROM_THE_START, "seed": 1}, DataLoader(IdDataset(20), batch_size=4), num_epochs=2
    )
    state = a.state_dict()
    state["version"] = version
    with pytest.raises(
        ValueError, match=rf"version {version!r}; readable versions: 1, 2, 3 \(current {STATE_VERSION}\)"
    ):
        a.load_state_dict(state)


def unsealed(state):
    """``state`` without its checksum: as a state of a version before checksums were written,
    so that what a reader checks after the checksum is reached."""
    return {k: v for k, v in state.items() if k != CHECKSUM}


def test_incomplete_states_are_refused_before_anything_changes():
    meta, old = version_1_state()
    a = loader_for(meta)
    del old["streak"]
    with pytest.raises(ValueError, match="version 1 is incomplete: no streak"):
        a.load_state_dict(old)
    state = a.state_dict()
    del state["guard"]
    with pytest.raises(ValueError, match="does not match its checksum"):  # a part removed: the content changed
        a.load_state_dict(state)
    with pytest.raises(ValueError, match="incomplete: no guard"):
        a.load_state_dict(unsealed(state))
    assert a.epoch == 0 and a.plan is None
    state = unsealed(a.state_dict())
    del state["pairing"]["losses_recorded"]
    with pytest.raises(ValueError, match="no count losses_recorded"):
        a.load_state_dict(state)
    state = unsealed(a.state_dict())
    state["pairing"]["batches_repeated"] = 1
    with pytest.raises(ValueError, match="unknown count"):
        a.load_state_dict(state)
    assert a.epoch == 0 and a.plan is None
    with pytest.raises(ValueError, match="not an EpochSiftingDataloader state"):
        a.load_state_dict({**a.state_dict(), "kind": "SiftingDataloader"})


def new_model():
    model = torch.nn.Linear(2, 3)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.weight.copy_(0.1 * torch.randn(3, 2, generator=g))
        model.bias.zero_()
    return model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)


def train_model(loader, model, opt, epochs, stop=None, wrap=None):
    """A linear classifier trained on each batch; (ids, the value weighted_loss returned) per step."""
    log = []
    while loader.epoch < epochs or loader.resuming:
        for x, y in wrap(loader) if wrap else loader:
            out = loader.weighted_loss(F.cross_entropy(model(x / 70), y, reduction="none"))
            opt.zero_grad()
            out.backward()
            opt.step()
            log.append((ids_of(x), out.detach()))
            if stop is not None and len(log) == stop:
                return log
    return log


def test_a_resume_after_prefetched_batches_matches_across_the_new_layout():
    """The new layout's own round trip with batches pulled ahead (the version-1 fixture's
    situation), with a model training between steps: the resumed run trains the same
    batches with the same weighted losses to the same parameters."""
    cfg = {**PRUNE_FROM_THE_START, "seed": 9, "kept_share": 0.5, "noise_guard_epochs": 1}

    def new():
        return EpochSiftingDataloader(cfg, DataLoader(IdDataset(70), batch_size=6, shuffle=True), num_epochs=4)

    full_model, full_opt = new_model()
    full = train_model(new(), full_model, full_opt, 4)
    a, (model, opt) = new(), new_model()
    # a full epoch of 12 batches, then 1 of the sifted epoch's 6, pulled 2 ahead
    first = train_model(a, model, opt, 4, stop=13, wrap=lambda loader: Prefetcher(loader, depth=2))
    assert a.state_dict()["progress"]["position"] == 1
    state = roundtrip({"loader": a.state_dict(), "model": model.state_dict(), "opt": opt.state_dict()})
    b, (model, opt) = new(), new_model()
    b.load_state_dict(state["loader"])
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    log = first + train_model(b, model, opt, 4)
    assert [ids for ids, _ in log] == [ids for ids, _ in full]
    assert all(torch.equal(out, ref) for (_, out), (_, ref) in zip(log, full))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), full_model.parameters()))
