"""The per-batch modules renamed in 0.8.0 so their names say what they hold: until 0.9.0 the
old paths still hand out the same objects (``shared/moved.py``). Importing an old path is
silent; each name read through it warns (``DeprecationWarning``) naming the new path and
0.9.0, and points at the user's line."""

import importlib
import re
import subprocess
import sys
import warnings

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
        {
            name: name
            for name in ("FORMAT", "PARTS", "epoch_in_progress", "loader_state", "restore_loader_state", "upgrade_v1")
        },
    ),
]


OLD = {old for old, _, _ in RENAMED}


@pytest.mark.parametrize("old, new, names", RENAMED, ids=[old.rsplit(".", 1)[1] for old, _, _ in RENAMED])
def test_an_old_module_path_imports_silently_and_warns_for_each_name_it_hands_out(old, new, names, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh: nothing warns at import
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = importlib.import_module(old)
    renamed = importlib.import_module(new)
    for old_name, new_name in names.items():
        message = f"{old}.{old_name} moved to {new}.{new_name}; {old} is removed in 0.9.0"
        with pytest.warns(DeprecationWarning, match=re.escape(message)) as record:
            value = getattr(module, old_name)
        assert value is getattr(renamed, new_name)
        assert record[0].filename == __file__  # the user's line, not the library's


@pytest.mark.slow  # a fresh interpreter imports torch
def test_the_package_imports_none_of_the_old_paths():
    """A warning from the library's own reads would reach every user: only the shims name the
    old paths. In a fresh interpreter, as a user's program starts: none of them is imported
    (the registry of moved modules, filled as each shim is imported, stays empty)."""
    modules = ["neuron_sift", "neuron_sift.integrations.schedules", "neuron_sift.integrations.trainer"]
    code = (
        f"import sys; [__import__(m) for m in {modules!r}]; from neuron_sift.shared.moved import MOVED; "
        f"print(sorted({{m for m in sys.modules if m in {OLD!r}}} | set(MOVED)))"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
