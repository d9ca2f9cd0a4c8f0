"""Modules moved with ``shared/moved.py``: each old path hands out the new module's objects
with a ``DeprecationWarning`` naming both paths and the release that removes the old one,
and refuses a name the new one lacks. Every such module of the package is in the registry
(``MOVED``), and none outlives the release it names: the test of that fails once
``neuron_sift.__version__`` reaches a shim's ``remove_in``."""

import importlib
import os
import pkgutil
import re
import sys
import warnings

import pytest
from packaging.version import Version

import neuron_sift
from neuron_sift.dataloader.sifting_pass import SiftingPass
from neuron_sift.shared import moved

HF = "neuron_sift.integrations.hf_trainer."  # the Hugging Face Trainer's room
# (old path, new path, a name read through it, the release that removes the old path)
SHIMS = [
    ("neuron_sift.epoch.planner", "neuron_sift.epoch.planning.planner", "EpochPlanner", "0.9.0"),
    ("neuron_sift.epoch.quantiles", "neuron_sift.epoch.selection.quantiles", "ScoreSummary", "0.9.0"),
    ("neuron_sift.epoch.sharded", "neuron_sift.epoch.planning.sharded_planner", "ShardedPlanner", "0.9.0"),
    ("neuron_sift.epoch.scores.sharded", "neuron_sift.epoch.planning.sharded_planner", "ShardedPlanner", "0.10.0"),
    ("neuron_sift.epoch.scores.ownership", "neuron_sift.epoch.planning.ownership", "Ownership", "0.10.0"),
    ("neuron_sift.epoch.resuming.reshard", "neuron_sift.epoch.resuming.replicated_reshard", "reshard", "0.10.0"),
    ("neuron_sift.dataloader.epoch_iterator", "neuron_sift.dataloader.sifting_pass", "SourceReader", "0.9.0"),
    ("neuron_sift.dataloader.counts", "neuron_sift.dataloader.sifting_counts", "SiftingCounts", "0.9.0"),
    ("neuron_sift.dataloader.checkpoint", "neuron_sift.dataloader.loader_checkpoint", "loader_state", "0.9.0"),
    ("neuron_sift.dataloader.planning", "neuron_sift.dataloader.batch_counts", "plan_epochs", "0.9.0"),
    ("neuron_sift.dataloader.scoring", "neuron_sift.scoring.forward", "scoring_mode", "0.10.0"),
    ("neuron_sift.integrations.trainer_checkpoint", HF + "checkpoint", "TrainerCheckpoints", "0.10.0"),
    ("neuron_sift.integrations.trainer_optimizer", HF + "optimizer", "check_trainer_optimizer", "0.10.0"),
    ("neuron_sift.integrations.trainer_patch", HF + "patch", "HookSet", "0.10.0"),
    ("neuron_sift.integrations.trainer_ranks", HF + "ranks", "TrainerWorld", "0.10.0"),
    ("neuron_sift.integrations.epoch_run_length", HF + "run_length", "planned_epochs", "0.10.0"),
]
IDS = [old for old, *_ in SHIMS]


def warning(old, name, new, new_name, remove_in):
    return re.escape(f"{old}.{name} moved to {new}.{new_name}; {old} is removed in {remove_in}")


def missing_optional(error):
    """The package outside neuron_sift (an extra not installed) an import failed on, also
    behind a module's own ``ImportError`` naming the extra; None for any other failure."""
    while isinstance(error, ImportError):
        if isinstance(error, ModuleNotFoundError) and error.name and error.name.split(".")[0] != "neuron_sift":
            return error.name
        error = error.__cause__
    return None


@pytest.fixture(scope="module")
def package():
    """Every module of the package, imported (which fills the registry), the modules left out
    because they need an optional package that is not installed (name -> that package), and
    the deprecation warnings the imports gave that point into the package."""
    modules, left_out = {}, {}

    def onerror(name):  # a subpackage walk_packages could not import
        error = sys.exc_info()[1]
        left_out[name] = missing_optional(error)
        if left_out[name] is None:
            raise error

    with warnings.catch_warnings(record=True) as caught:  # an extra's own import-time warnings pass
        warnings.simplefilter("always")
        for info in pkgutil.walk_packages(neuron_sift.__path__, "neuron_sift.", onerror=onerror):
            try:
                modules[info.name] = importlib.import_module(info.name)
            except ImportError as error:
                left_out[info.name] = missing_optional(error)
                if left_out[info.name] is None:
                    raise
    root = os.path.dirname(neuron_sift.__file__)
    ours = [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, DeprecationWarning) and os.path.abspath(w.filename).startswith(root + os.sep)
    ]
    return modules, left_out, ours


def from_moved_module(module):
    return getattr(vars(module).get("__getattr__"), "__module__", None) == moved.__name__


@pytest.mark.parametrize("old, new, name, remove_in", SHIMS, ids=IDS)
def test_an_old_path_hands_out_the_new_object_with_a_warning(old, new, name, remove_in):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=warning(old, name, new, name, remove_in)) as record:
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    assert record[0].filename == __file__  # the line that read it, not the library's


@pytest.mark.parametrize("old, new, name, remove_in", SHIMS, ids=IDS)
def test_an_old_path_refuses_a_name_the_new_module_lacks(old, new, name, remove_in):
    with pytest.raises(AttributeError, match=f"moved to {new!r}"):
        _ = importlib.import_module(old).no_such_name


def test_a_renamed_name_reads_its_new_name_with_a_warning_naming_both():
    """``SiftingEpoch`` of ``dataloader.epoch_iterator`` is ``SiftingPass`` of
    ``dataloader.sifting_pass``, read through an attribute or a from-import."""
    old, new = "neuron_sift.dataloader.epoch_iterator", "neuron_sift.dataloader.sifting_pass"
    match = warning(old, "SiftingEpoch", new, "SiftingPass", "0.9.0")
    with pytest.warns(DeprecationWarning, match=match) as record:
        value = importlib.import_module(old).SiftingEpoch
    assert value is SiftingPass and record[0].filename == __file__
    with pytest.warns(DeprecationWarning, match=match) as record:
        from neuron_sift.dataloader.epoch_iterator import SiftingEpoch
    assert SiftingEpoch is SiftingPass and record[0].filename == __file__
    assert not hasattr(importlib.import_module(new), "SiftingEpoch")  # the old name only at the old path


def test_every_moved_module_of_the_package_is_in_the_registry(package):
    """A module whose ``__getattr__`` comes from ``moved_module`` is registered under its own
    name, pointing at a real module that is not itself moved; the registry holds nothing
    else, this file's table names every entry with its release, and no module keeps an old
    name with a ``__getattr__`` of its own."""
    modules, left_out, ours = package
    assert ours == []  # importing a module reads no name through an old path (nor warns otherwise)
    shims = {name for name, module in modules.items() if from_moved_module(module)}
    assert shims == set(moved.MOVED), "moved_module(old=...) must be the shim's own __name__"
    for old, (new, _) in moved.MOVED.items():
        assert new in modules and new not in moved.MOVED, (old, new)
    assert {old: (new, remove_in) for old, new, _, remove_in in SHIMS} == moved.MOVED
    assert not set(moved.MOVED) & set(left_out)
    # Any other module-level __getattr__ is no moved path: the DCP adapters imported on first use.
    own = {name for name, module in modules.items() if "__getattr__" in vars(module) and name not in shims}
    assert own == {"neuron_sift.integrations"}


def test_no_moved_module_outlives_the_release_it_names(package):
    """Fails once the package's version reaches a shim's ``remove_in``: delete the shim (and
    its row in ``SHIMS``) in that release, as its warning promised."""
    version = Version(neuron_sift.__version__)
    overdue = {old: remove_in for old, (_, remove_in) in moved.MOVED.items() if version >= Version(remove_in)}
    assert overdue == {}, f"neuron_sift {version} still holds the moved modules it removes: {overdue}"


def test_a_removal_release_must_be_a_release_number(monkeypatch):
    monkeypatch.setattr(moved, "MOVED", dict(moved.MOVED))
    with pytest.raises(ValueError, match="remove_in must be a release like '0.9.0', got 'next'"):
        moved.moved_module("neuron_sift.nowhere", "neuron_sift.shared.moved", remove_in="next")
    assert "neuron_sift.nowhere" not in moved.MOVED
