"""The single-pass language-model task's corpus: the running Python's own standard library,
byte-level, read from disk (every machine with Python has it; nothing is downloaded).

The rule (``corpus_files``): every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``,
paths sorted, except those under a folder named ``site-packages``, ``test``, ``tests`` or
``idle_test`` (installed packages differ between machines; the test suites are mostly
generated fixtures). ``pydoc_data/topics.py`` is one of them: it holds the documentation's
topics as text, so the corpus is code and English prose.

Why its size and SHA-256 go into every record: another Python's standard library is another
corpus, and losses on two corpora are not comparable.

The held-out split is by file (``HELDOUT_EVERY``): every k-th file of the sorted list is
held out whole, so no held-out sequence shares a file with a training one (a split by
sequence would put the neighbours of a held-out window in training). Training bytes are the
other files concatenated in order, cut into non-overlapping windows of ``context + 1``
bytes (the model reads ``context`` bytes and predicts the next byte at each position); the
held-out windows are a fixed, seeded sample of the held-out files' windows, the same in
every run of a corpus.
"""

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idle_test"})
HELDOUT_EVERY = 20  # file i (sorted) is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1
HELDOUT_SEED = 4242  # the held-out windows sampled; the same for every run seed


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path | None = None) -> list[Path]:
    """The corpus's files under ``root`` (default: the stdlib), by the module's rule, sorted."""
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a folder")
    files = [p for p in root.rglob("*.py") if p.is_file() and not EXCLUDED_DIRS & set(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@dataclass
class Corpus:
    """Training windows (``train``: ``[n, context + 1]`` uint8, in corpus order) and held-out
    windows (``heldout``), and what identifies the corpus in a record (``describe``)."""

    train: torch.Tensor
    heldout: torch.Tensor
    context: int
    n_files: int
    n_bytes: int
    sha256: str
    train_bytes: int
    heldout_bytes: int
    root: str

    def describe(self) -> dict:
        return {
            "corpus": "python stdlib *.py (byte-level, vocab 256)",
            "root": self.root,
            "files": self.n_files,
            "bytes": self.n_bytes,
            "sha256": self.sha256,
            "rule": f"sorted *.py under the stdlib, without folders {sorted(EXCLUDED_DIRS)}",
            "heldout_rule": f"every {HELDOUT_EVERY}th file (sorted index % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1})",
            "context": self.context,
            "train_bytes": self.train_bytes,
            "heldout_bytes": self.heldout_bytes,
            "train_sequences": int(self.train.shape[0]),
            "heldout_sequences": int(self.heldout.shape[0]),
        }


def _windows(data: bytes, width: int) -> torch.Tensor:
    n = len(data) // width
    flat = torch.frombuffer(bytearray(data[: n * width]), dtype=torch.uint8)
    return flat.view(n, width)


def read_corpus(context: int, heldout_sequences: int, root: Path | None = None) -> Corpus:
    """The corpus cut into windows of ``context + 1`` bytes; ``heldout_sequences`` held-out
    windows sampled (seeded) from the held-out files (all of them if fewer)."""
    if context < 2:
        raise ValueError(f"context must be >= 2 bytes, got {context}")
    if heldout_sequences < 1:
        raise ValueError(f"heldout_sequences must be >= 1, got {heldout_sequences}")
    files = corpus_files(root)
    if len(files) < HELDOUT_EVERY:
        raise ValueError(f"the corpus has {len(files)} files; the held-out split needs at least {HELDOUT_EVERY}")
    digest = hashlib.sha256()
    train_parts: list[bytes] = []
    heldout_parts: list[bytes] = []
    for i, path in enumerate(files):
        data = path.read_bytes()
        digest.update(data)
        (heldout_parts if i % HELDOUT_EVERY == HELDOUT_EVERY - 1 else train_parts).append(data)
    train_data, heldout_data = b"".join(train_parts), b"".join(heldout_parts)
    train = _windows(train_data, context + 1)
    heldout_all = _windows(heldout_data, context + 1)
    g = torch.Generator().manual_seed(HELDOUT_SEED)
    pick = torch.randperm(heldout_all.shape[0], generator=g)[:heldout_sequences].sort().values
    return Corpus(
        train=train,
        heldout=heldout_all[pick].clone(),
        context=context,
        n_files=len(files),
        n_bytes=len(train_data) + len(heldout_data),
        sha256=digest.hexdigest(),
        train_bytes=len(train_data),
        heldout_bytes=len(heldout_data),
        root=str(stdlib_root() if root is None else root),
    )


def stream_order(n: int, seed: int) -> torch.Tensor:
    """The seed's order of the training windows: one permutation, the same for every arm of
    the seed (a single pass reads a prefix of it; an arm that sifts reads a longer prefix)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(1_000_003 * seed + 17))
