"""The per-batch modules renamed so their names say what they hold: for one release the old
paths still import the same objects, with a ``DeprecationWarning`` that names the new path
and points at the user's import line."""

import subprocess
import sys

import pytest

RENAMED = [
    (
        "neuron_sift.dataloader.epoch_iterator",
        "neuron_sift.dataloader.sifting_pass",
        {"SiftingEpoch": "SiftingPass", "SiftingPass": "SiftingPass", "SourceReader": "SourceReader"},
    ),
    (
        "neuron_sift.dataloader.planning",
        "neuron_sift.dataloader.batch_counts",
        {name: name for name in ("check_yields_a_batch", "plan_epochs", "source_batch_sizes")},
    ),
    ("neuron_sift.dataloader.counts", "neuron_sift.dataloader.sifting_counts", {"SiftingCounts": "SiftingCounts"}),
    (
        "neuron_sift.dataloader.checkpoint",
        "neuron_sift.dataloader.loader_checkpoint",
        {name: name for name in ("FORMAT", "epoch_in_progress", "loader_state", "restore_loader_state", "upgrade_v1")},
    ),
]


OLD = {old for old, _, _ in RENAMED}


@pytest.mark.parametrize("old, new, names", RENAMED, ids=[old.rsplit(".", 1)[1] for old, _, _ in RENAMED])
def test_an_old_module_path_warns_and_holds_the_same_objects(old, new, names, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh: the warning comes at import
    with pytest.warns(DeprecationWarning, match=f"{old} is renamed {new}") as record:
        __import__(old)
    assert record[0].filename == __file__  # the user's import line, not the library's
    module, renamed = sys.modules[old], sys.modules[new]
    for old_name, new_name in names.items():
        assert getattr(module, old_name) is getattr(renamed, new_name)


@pytest.mark.slow  # a fresh interpreter imports torch
def test_the_package_imports_none_of_the_old_paths():
    """A warning from the library's own imports would reach every user: only the shims name
    the old paths. In a fresh interpreter, as a user's program starts."""
    modules = ["neuron_sift", "neuron_sift.integrations.schedules", "neuron_sift.integrations.trainer"]
    code = f"import sys; [__import__(m) for m in {modules!r}]; print(sorted(m for m in sys.modules if m in {OLD!r}))"
    out = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
