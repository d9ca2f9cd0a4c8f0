"""Ranks whose epoch loaders were built with different settings are refused at construction,
on every rank, naming each setting and its value on each rank: otherwise a sharded run waits
in the first sifted epoch's summary all-gather until the process group's timeout, and a
replicated one aborts on a collective mismatch or trains each rank's own plan without a word.

Two ranks as threads of this process, with the loader's own ``RankGroup`` over a patched
``torch.distributed`` (``tests/neuron_sift/shared/thread_dist.py``); one real gloo run of two
processes checks the refusal comes within seconds."""

import json
import multiprocessing
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, SubsetRandomSampler

from neuron_sift import EpochSiftingDataloader
from neuron_sift.epoch.planning.rank_settings import SAMPLER_HINT, SEED_HINT
from tests.neuron_sift.epoch.helpers import IdDataset
from tests.neuron_sift.shared.thread_dist import build_on_ranks


def build(n=400, batch_size=16, drop_last=False, num_epochs=4, sampler=None, generator=None, **config):
    config.setdefault("seed", 5)
    shuffle = None if sampler is not None else config.pop("shuffle", True)
    source = DataLoader(
        IdDataset(n), batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, sampler=sampler, generator=generator
    )
    return EpochSiftingDataloader(config, source, num_epochs=num_epochs)


# (the setting's name in the message, rank 0's arguments, rank 1's, the values shown)
DIFFERENCES = [
    ("dataset length", {"n": 400}, {"n": 420}, "400", "420"),
    ("kept_share", {"kept_share": 0.5}, {"kept_share": 0.3}, "0.5", "0.3"),
    ("kept_share", {"kept_share": None}, {"kept_share": 0.3}, "None", "0.3"),
    ("batch_size", {"batch_size": 16}, {"batch_size": 20}, "16", "20"),
    ("drop_last", {"drop_last": False}, {"drop_last": True}, "False", "True"),
    ("seed", {"seed": 1}, {"seed": 2}, "1", "2"),
    (  # no seed in the config: the source DataLoader's generator's decides the plans
        "seed",
        {"seed": None, "generator": torch.Generator().manual_seed(11)},
        {"seed": None, "generator": torch.Generator().manual_seed(12)},
        "11",
        "12",
    ),
    ("num_epochs", {"num_epochs": 4}, {"num_epochs": 5}, "4", "5"),
    ("num_epochs", {"num_epochs": 4}, {"num_epochs": None}, "4", "None"),
    ("policy", {"policy": "percentile"}, {"policy": "below_mean"}, "'percentile'", "'below_mean'"),
    ("beta_value", {"beta_value": 1.0}, {"beta_value": 2.0}, "1.0", "2.0"),
    ("min_keep_probability", {}, {"min_keep_probability": 0.1}, "0.05", "0.1"),
    ("prune_ratio", {}, {"prune_ratio": 0.4}, "0.5", "0.4"),
    ("warmup_epochs", {}, {"warmup_epochs": 2}, "1", "2"),
    ("anneal_fraction", {}, {"anneal_fraction": 0.25}, "0.125", "0.25"),
    ("max_weight", {}, {"max_weight": 2.0}, "None", "2.0"),
    ("noise_guard_epochs", {}, {"noise_guard_epochs": 2}, "0", "2"),
    ("noise_guard_quantile", {}, {"noise_guard_quantile": 0.9}, "0.8", "0.9"),
    (
        "sampler's samples (CRC-32 of their ids; None: all)",
        {"sampler": SubsetRandomSampler(range(0, 300))},
        {"sampler": SubsetRandomSampler(range(100, 400))},
        None,
        None,
    ),
    ("sampler's order (True: dataset order)", {"shuffle": True}, {"shuffle": False}, "False", "True"),
]


@pytest.mark.parametrize("table", ["replicated", "sharded"])
@pytest.mark.parametrize(("setting", "first", "second", "shown0", "shown1"), DIFFERENCES, ids=lambda v: str(v)[:24])
def test_ranks_with_a_different_setting_are_refused_on_every_rank(
    monkeypatch, table, setting, first, second, shown0, shown1
):
    args = [dict(first), dict(second)]
    out = build_on_ranks(monkeypatch, 2, lambda rank: build(score_table=table, **args[rank]))
    assert all(isinstance(o, ValueError) for o in out), out  # every rank refuses: none waits in a collective
    message = str(out[0])
    assert str(out[1]) == message
    assert message.startswith("EpochSiftingDataloader was built with different settings on different ranks")
    assert message.count("differs between ranks") == 1, message  # only the setting that differs
    expected = f"{setting} differs between ranks: rank 0: {shown0}; rank 1: {shown1}"
    assert (expected if shown0 is not None else f"{setting} differs between ranks: rank 0: ") in message
    if setting == "seed":
        assert SEED_HINT in message
    if setting.startswith("sampler"):
        assert SAMPLER_HINT in message and "same sampler" in message


def test_a_different_score_table_is_refused_on_every_rank(monkeypatch):
    tables = ["replicated", "sharded"]
    out = build_on_ranks(monkeypatch, 2, lambda rank: build(kept_share=0.5, score_table=tables[rank]))
    assert all(isinstance(o, ValueError) for o in out), out
    assert "score_table differs between ranks: rank 0: 'replicated'; rank 1: 'sharded'" in str(out[0])
    assert str(out[1]) == str(out[0])


def test_several_differences_are_named_together(monkeypatch):
    args = [{"n": 400, "kept_share": 0.5, "batch_size": 16}, {"n": 420, "kept_share": 0.3, "batch_size": 20}]
    out = build_on_ranks(monkeypatch, 2, lambda rank: build(score_table="sharded", **args[rank]))
    message = str(out[0])
    for line in (
        "dataset length differs between ranks: rank 0: 400; rank 1: 420",
        "kept_share differs between ranks: rank 0: 0.5; rank 1: 0.3",
        "batch_size differs between ranks: rank 0: 16; rank 1: 20",
    ):
        assert line in message
    assert isinstance(out[1], ValueError) and str(out[1]) == message


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_ranks_with_the_same_settings_are_built_and_plan_the_same_epochs(monkeypatch, table):
    """No seed given anywhere: every rank takes the same ``torch.initial_seed()``."""
    out = build_on_ranks(monkeypatch, 2, lambda rank: build(kept_share=0.5, score_table=table, seed=None))
    assert all(isinstance(o, EpochSiftingDataloader) for o in out), out
    assert out[0].seed == out[1].seed == torch.initial_seed()
    assert [o.ranks.rank for o in out] == [0, 1]
    assert out[0].planned_steps() == out[1].planned_steps()


# -- two gloo processes -------------------------------------------------------------------


def _gloo_rank(rank: int, store: str, out: str) -> None:
    """One rank: a sharded loader whose budget differs from its peer's; records what it raised
    and how long construction took."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(60))
    start = time.monotonic()
    try:
        build(kept_share=0.5 if rank == 0 else 0.3, score_table="sharded")
        refused = None
    except ValueError as exc:
        refused = str(exc)
    seconds = time.monotonic() - start
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"refused": refused, "seconds": seconds}, f)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_with_different_budgets_both_refuse_within_seconds(tmp_path):
    context = multiprocessing.get_context("spawn")
    out = str(tmp_path / "rank")
    procs = [context.Process(target=_gloo_rank, args=(r, str(tmp_path / "store"), out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    runs = [json.loads((tmp_path / f"rank.{r}").read_text()) for r in range(2)]
    for r in runs:
        assert r["refused"] is not None, "the rank built its loader"
        assert "kept_share differs between ranks: rank 0: 0.5; rank 1: 0.3" in r["refused"]
        assert r["seconds"] < 20  # the one construction-time all-gather, not a process group's timeout
