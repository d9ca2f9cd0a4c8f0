"""Shared pieces of the epoch-level tests: an id-carrying dataset, an oracle loss and a small
budgeted training set-up, and where the worker scripts and data files are."""

import json
import os
import queue
import threading

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from neuron_sift import EpochSiftingDataloader

# The start rule (``start_rank_correlation``) off: tests of planning, resuming and pairing see
# every sifted epoch prune from the first one, as before the rule existed; the rule itself is
# tested in ``selection/test_start_rule.py`` and on by default wherever a test leaves it.
PRUNE_FROM_THE_START = {"start_rank_correlation": None}

# The worker scripts (``*_worker.py``, run under torchrun by path) and ``data/`` stay here, at the
# top of the epoch tests, whichever sub-folder the test that runs or reads them lives in.
EPOCH_TESTS = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(EPOCH_TESTS, "data")
# The repository root: where a fresh process must start for ``tests.*`` to import.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(EPOCH_TESTS)))


def version_1_state():
    """The state the version-1 code wrote mid-epoch (``data/make_epoch_state_v1.py``), read
    with ``weights_only``, and what it was written from (``meta``: config, sizes, the run's
    reference ids and scores)."""
    with open(os.path.join(DATA, "epoch_state_v1.json")) as f:
        meta = json.load(f)
    return meta, torch.load(os.path.join(DATA, "epoch_state_v1.pt"), weights_only=True)


def worker(name: str) -> str:
    """The path of the worker script ``name`` (``"elastic_worker.py"``)."""
    path = os.path.join(EPOCH_TESTS, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no worker script {path}")
    return path


class IdDataset(Dataset):
    """Sample ``i`` is ``(x = [i, ...], y = i % 3)``; counts every ``__getitem__`` (main process)."""

    def __init__(self, n: int, width: int = 2):
        self.n = n
        self.width = width
        self.loaded = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loaded.append(int(i))
        x = torch.full((self.width,), float(i))
        return x, torch.tensor(i % 3)


def oracle(ids: torch.Tensor) -> torch.Tensor:
    """A fixed, distinct-ish loss per sample id."""
    return ((ids.double() * 7919) % 1009 / 1009.0 + 0.001).float()


def oracle_loss(x: torch.Tensor) -> torch.Tensor:
    return oracle(x[:, 0].round().long())


def ids_of(x: torch.Tensor):
    return x[:, 0].round().long().tolist()


class Prefetcher:
    """A prefetching wrapper like torch-xla's MpDeviceLoader: a thread pulls ``depth`` batches
    ahead of the training loop."""

    def __init__(self, loader, depth: int = 3):
        self.loader = loader
        self.depth = depth

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        q = queue.Queue(maxsize=self.depth)
        done = object()

        def pull():
            for b in self.loader:
                q.put(b)
            q.put(done)

        t = threading.Thread(target=pull, daemon=True)
        t.start()
        while True:
            b = q.get()
            if b is done:
                break
            yield b
        t.join()


def small_parts(epochs=4):
    """A linear classifier, its SGD and a budgeted epoch loader over 256 samples in batches of 32."""
    torch.manual_seed(0)
    x = torch.randn(256, 6)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    loader = EpochSiftingDataloader(
        {"seed": 0, "kept_share": 0.5, **PRUNE_FROM_THE_START},
        DataLoader(TensorDataset(x, y), batch_size=32),
        num_epochs=epochs,
    )
    return model, opt, loader
