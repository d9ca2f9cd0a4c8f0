"""The score-table registry (``neuron_sift.epoch.score_table``), the one place the config's
``score_table`` is read. What users rely on: every name ``EpochSiftConfig`` accepts is a
registered table; each builds the planner and shares of its kind from the run's settings;
its shares check accepts its own shares' state and refuses the other table's; and a loader
runs on exactly the parts its table built."""

import dataclasses

import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader
from neuron_sift.epoch.planning.plan import PlanSettings
from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.planning.sharded_planner import ShardedPlanner
from neuron_sift.epoch.score_table import SCORE_TABLE_REGISTRY, score_table
from neuron_sift.epoch.scores.owned_shares import OwnedShares
from neuron_sift.epoch.scores.rank_shares import RankShares
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.sift_config.epoch_config import SCORE_TABLES
from tests.neuron_sift.epoch.helpers import IdDataset

# What each table builds: its planner's type and its shares' type.
BUILDS = {"replicated": (EpochPlanner, RankShares), "sharded": (ShardedPlanner, OwnedShares)}


def one_process():
    return RankGroup(False, torch.device("cpu"))


def settings(name, n=10):
    return PlanSettings(EpochSiftConfig(score_table=name, kept_share=0.5), n, 2, False, 3, 4)


def test_the_registry_holds_every_table_the_config_accepts():
    assert sorted(SCORE_TABLE_REGISTRY) == sorted(SCORE_TABLES) == sorted(BUILDS)
    assert [score_table(name).name for name in SCORE_TABLES] == list(SCORE_TABLES)


@pytest.mark.parametrize("name", SCORE_TABLES)
def test_each_table_builds_its_planner_and_shares_from_the_settings(name):
    run = settings(name)
    parts = score_table(name).build(run, one_process())
    planner_type, shares_type = BUILDS[name]
    assert type(parts.planner) is planner_type and type(parts.shares) is shares_type
    planner = parts.planner
    assert (planner.n, planner.batch_size, planner.seed, planner.num_epochs) == (10, 2, 3, 4)
    assert planner.config.score_table == name
    if name == "sharded":  # its shares host guests in the planner's own ownership map
        assert parts.shares.planner is planner


@pytest.mark.parametrize("name", SCORE_TABLES)
def test_each_tables_shares_check_accepts_its_own_shares_state_and_refuses_the_others(name):
    states = {other: score_table(other).build(settings(other), one_process()).shares.state_dict() for other in BUILDS}
    check = score_table(name).check_shares
    check(states[name], 10)
    for other in set(BUILDS) - {name}:
        with pytest.raises(ValueError, match=r"invalid checkpoint: shares"):
            check(states[other], 10)


def test_an_unknown_name_is_a_key_error_naming_the_registered_ones():
    with pytest.raises(KeyError, match=r"no score table 'columnar'; registered: \['replicated', 'sharded'\]"):
        score_table("columnar")


@pytest.mark.parametrize("name", SCORE_TABLES)
def test_a_loader_runs_on_the_parts_its_table_built(monkeypatch, name):
    """The loader asks the registry for its config's table and keeps what that table built:
    its planner and shares are those objects, planned from the loader's own settings."""
    built = []
    table = SCORE_TABLE_REGISTRY[name]

    def build(run, ranks):
        parts = table.build(run, ranks)
        built.append((run, parts))
        return parts

    monkeypatch.setitem(SCORE_TABLE_REGISTRY, name, dataclasses.replace(table, build=build))
    source = DataLoader(IdDataset(12), batch_size=4, shuffle=True)
    loader = EpochSiftingDataloader({"seed": 1, "score_table": name}, source, num_epochs=3)
    ((run, parts),) = built
    assert loader.score_table.name == name
    assert loader.planner is parts.planner and loader.shares is parts.shares
    assert type(loader.planner) is BUILDS[name][0] and type(loader.shares) is BUILDS[name][1]
    assert (run.n, run.batch_size, run.seed, run.num_epochs, run.world_size, run.rank) == (12, 4, 1, 3, 1, 0)
    ids = [int(i) for x, _y in loader for i in x[:, 0].round().long()]
    assert sorted(ids) == list(range(12))  # and it trains on them: the warm-up, every sample once
