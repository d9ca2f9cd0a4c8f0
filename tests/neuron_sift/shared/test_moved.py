"""Modules moved with ``shared/moved.py``: each old path hands out the new module's objects
with a ``DeprecationWarning`` naming both paths, and refuses a name the new one lacks."""

import importlib

import pytest

MOVED = [
    ("neuron_sift.epoch.planner", "neuron_sift.epoch.planning.planner", "EpochPlanner"),
    ("neuron_sift.epoch.quantiles", "neuron_sift.epoch.selection.quantiles", "ScoreSummary"),
    ("neuron_sift.epoch.sharded", "neuron_sift.epoch.scores.sharded", "ShardedPlanner"),
    ("neuron_sift.dataloader.scoring", "neuron_sift.scoring.forward", "scoring_mode"),
]


@pytest.mark.parametrize("old, new, name", MOVED, ids=[old for old, _, _ in MOVED])
def test_an_old_path_hands_out_the_new_object_with_a_warning(old, new, name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{name}") as record:
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    assert record[0].filename == __file__  # the line that read it, not the library's


@pytest.mark.parametrize("old, new, name", MOVED, ids=[old for old, _, _ in MOVED])
def test_an_old_path_refuses_a_name_the_new_module_lacks(old, new, name):
    with pytest.raises(AttributeError, match=f"moved to {new!r}"):
        _ = importlib.import_module(old).no_such_name
