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

The reference slice (``REFERENCE_RESIDUE``): the files whose sorted index ``i`` has
``i % HELDOUT_EVERY == REFERENCE_RESIDUE`` are taken out of training too and returned whole
as ``Corpus.reference`` (windows in file order). A sifting rule that scores a window by its
excess loss (the learner's loss minus a reference model's) needs a reference model trained
on clean text the learner never reads: one trained on the stream itself would have a low
loss on the very windows it memorised, and rank them learnable. Cut by file, the slice is as
far from the training windows as the held-out files are. It changed this corpus's training
windows: records written before it trained on about a twentieth more files (with the same
held-out windows and checksum), so ``describe()`` holds the reference rule and size.
``lm_web.py`` builds the web-like stream on top of this corpus.
"""

import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idle_test"})
HELDOUT_EVERY = 20  # file i (sorted) is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1
REFERENCE_RESIDUE = 9  # file i (sorted) is the reference slice when i % HELDOUT_EVERY == REFERENCE_RESIDUE
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
    """Training windows (``train``: ``[n, context + 1]`` uint8, in corpus order), what each
    one is (``kinds``, uint8 per window: ``lm_web.KIND_NAMES``; all clean here), held-out
    windows (``heldout``), the reference slice (``reference``), and what identifies the
    corpus in a record (``describe``; ``mix``: what a mixed stream adds to it)."""

    train: torch.Tensor
    heldout: torch.Tensor
    reference: torch.Tensor
    kinds: torch.Tensor
    context: int
    n_files: int
    n_bytes: int
    sha256: str
    train_bytes: int
    heldout_bytes: int
    reference_bytes: int
    root: str
    name: str = "clean"
    mix: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "corpus": "python stdlib *.py (byte-level, vocab 256)",
            "root": self.root,
            "files": self.n_files,
            "bytes": self.n_bytes,
            "sha256": self.sha256,
            "rule": f"sorted *.py under the stdlib, without folders {sorted(EXCLUDED_DIRS)}",
            "heldout_rule": f"every {HELDOUT_EVERY}th file (sorted index % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1})",
            "reference_rule": f"the clean files with sorted index % {HELDOUT_EVERY} == {REFERENCE_RESIDUE}, "
            "out of training, every window in file order",
            "context": self.context,
            "train_bytes": self.train_bytes,
            "heldout_bytes": self.heldout_bytes,
            "reference_bytes": self.reference_bytes,
            "train_sequences": int(self.train.shape[0]),
            "heldout_sequences": int(self.heldout.shape[0]),
            "reference_sequences": int(self.reference.shape[0]),
            **self.mix,
        }


def cut_windows(data: bytes, width: int) -> torch.Tensor:
    """Non-overlapping windows of ``width`` bytes; the tail shorter than a window is dropped
    (a window padded with bytes that are not in the data would teach the model them)."""
    n = len(data) // width
    if n == 0:
        return torch.empty(0, width, dtype=torch.uint8)
    flat = torch.frombuffer(bytearray(data[: n * width]), dtype=torch.uint8)
    return flat.view(n, width)


def read_corpus(context: int, heldout_sequences: int, root: Path | None = None) -> Corpus:
    """The corpus cut into windows of ``context + 1`` bytes; ``heldout_sequences`` held-out
    windows sampled (seeded) from the held-out files (all of them if fewer); the reference
    slice's files out of training, whole."""
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
    reference_parts: list[bytes] = []
    for i, path in enumerate(files):
        data = path.read_bytes()
        digest.update(data)
        residue = i % HELDOUT_EVERY
        part = {HELDOUT_EVERY - 1: heldout_parts, REFERENCE_RESIDUE: reference_parts}.get(residue, train_parts)
        part.append(data)
    train_data, heldout_data = b"".join(train_parts), b"".join(heldout_parts)
    reference_data = b"".join(reference_parts)
    train = cut_windows(train_data, context + 1)
    heldout_all = cut_windows(heldout_data, context + 1)
    g = torch.Generator().manual_seed(HELDOUT_SEED)
    pick = torch.randperm(heldout_all.shape[0], generator=g)[:heldout_sequences].sort().values
    return Corpus(
        train=train,
        heldout=heldout_all[pick].clone(),
        reference=cut_windows(reference_data, context + 1),
        kinds=torch.zeros(train.shape[0], dtype=torch.uint8),
        context=context,
        n_files=len(files),
        n_bytes=len(train_data) + len(heldout_data) + len(reference_data),
        sha256=digest.hexdigest(),
        train_bytes=len(train_data),
        heldout_bytes=len(heldout_data),
        reference_bytes=len(reference_data),
        root=str(stdlib_root() if root is None else root),
    )


def stream_order(n: int, seed: int) -> torch.Tensor:
    """The seed's order of the training windows: one permutation, the same for every arm of
    the seed (a single pass reads a prefix of it; an arm that sifts reads a longer prefix)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(1_000_003 * seed + 17))
