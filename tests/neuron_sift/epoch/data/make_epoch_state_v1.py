"""How ``epoch_state_v1.pt`` and ``epoch_state_v1.json`` were written: with the code of commit
4687277 (``EpochSiftingDataloader`` state version 1, before the loader was split into parts).

Kept to document the fixture; rerunning it with today's code writes today's layout, not
version 1. Run from the repository root: ``python tests/neuron_sift/epoch/data/make_epoch_state_v1.py``.
The JSON holds the uninterrupted run's remaining batches, kept counts and final scores, so
the test can check that the old checkpoint resumes exactly.
"""

import json

import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftingDataloader
from tests.neuron_sift.epoch.helpers import IdDataset, Prefetcher, ids_of, oracle_loss

CFG = {"seed": 11, "noise_guard_epochs": 1, "noise_guard_quantile": 0.8, "anneal_fraction": 0.25}


def new():
    return EpochSiftingDataloader(CFG, DataLoader(IdDataset(48), batch_size=4, shuffle=True), num_epochs=4)


def train(loader, epochs, stop=None, wrap=None):
    seen = []
    for _ in range(epochs):
        src = wrap(loader) if wrap else loader
        for x, _y in src:
            seen.append(ids_of(x))
            loader.weighted_loss(oracle_loss(x))
            if stop is not None and len(seen) == stop:
                return seen
    return seen


full = train(new(), 4)
a = new()
STOP = 18  # the second sifted epoch, half-way; a prefetcher pulled batches ahead
first = train(a, 4, stop=STOP, wrap=lambda l: Prefetcher(l, depth=2))
assert first == full[:STOP]
state = a.state_dict()
assert state["in_progress"] and state["version"] == 1, (state["in_progress"], state["epochs_started"])
torch.save(state, "tests/neuron_sift/epoch/data/epoch_state_v1.pt")
ref = new()
train(ref, 4)
json.dump(
    {
        "config": CFG,
        "samples": 48,
        "batch_size": 4,
        "num_epochs": 4,
        "stop_after": STOP,
        "rest": full[STOP:],
        "kept": [h["kept"] for h in ref.history],
        "final_scores": ref.tables.snapshot().tolist(),
        "written_by": "neuron_sift at commit 4687277 (EpochSiftingDataloader state version 1)",
    },
    open("tests/neuron_sift/epoch/data/epoch_state_v1.json", "w"),
    indent=None,
)
print(
    state["epochs_started"],
    state["position"],
    [h["kind"] for h in state["history"]],
    state["plan"]["kind"],
    state["streak"].sum(),
)
