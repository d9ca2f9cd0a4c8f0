"""The suite's tasks: data (generated or bundled locally, nothing is downloaded) and models.

* ``mnist1d`` (the main job): MNIST-1D from the ``mnist1d`` package's ``make_dataset``
  (its generator, never its downloading ``get_dataset``), a small 1-D CNN.
* ``mnist1d-noisy``: the same with 20% of the training labels flipped to another class
  (test labels clean); the runner records the share of trained samples that are mislabeled.
* ``mnist1d-redundant``: the data where selection should pay if it ever does. The same
  number of training samples as ``mnist1d``, but only a quarter of them are distinct:
  10,000 distinct MNIST-1D samples, plus 30,000 near-duplicates, each a copy of one of
  1,000 of those samples (30 copies each) with small Gaussian jitter (sd 0.05; the
  signals have sd about 1) added to its signal. The test set is MNIST-1D's usual one.
  It stands for large real datasets in which a big share of the samples repeats a few
  others almost exactly: web-crawled image and text corpora with re-encoded, resized or
  boilerplate copies, logs and sensor streams where the common case recurs thousands of
  times. Training on every copy every epoch spends most of the compute on samples the
  model already fits; a selection rule that skips them gets the same accuracy for less.
* ``bert``: a small BERT (``BertForSequenceClassification`` from a ``BertConfig``, random
  init, no dropout) classifying generated token sequences (``keyword_sequences``), a lexicon
  task like sentiment classification: 1,600 cue words, each evidence for one of 4 classes,
  drawn with Zipf frequencies among filler words; the label is the class with the most cue
  words, usually by a lead of one. The model has to learn the lexicon (its rare words late,
  some too rare to learn from 8,000 sequences) and count, so accuracy rises through the
  whole run and ends short of 100%. Adam at 2e-3 with a linear warm-up over the first 10%
  of each arm's own run (``warmup``), then the usual cosine decay. Shorter full-data runs
  (``full@0.4`` to ``full@0.8``) can still end before they leave the early plateau. The
  previous version (800 cue words, lr 1e-3, no warm-up, BERT's default dropout 0.1) left
  ``full`` on a plateau in most seeds: the model told the two leading classes apart from
  the rest but not from each other (a lead of one); attention dropout blurs exactly that
  count, and without warm-up and at the lower rate the seeds that escaped did so by luck.
  The first version (4 keywords, no lexicon) was too easy to tell the arms apart. The
  measured accuracies of every version are in ``docs/benchmarks.md``.
* ``digits``: scikit-learn's bundled 8x8 digits and an MLP; the seconds-long smoke task.
* ``mnist1d-long``: ``mnist1d``'s data and model trained for ``LONG_EPOCHS`` epochs, where
  more epochs add less to ``full``'s accuracy than it varies between seeds. Why: on the
  10-epoch main job every epoch still adds accuracy, so skipping samples costs accuracy
  that more epochs would have bought; published selection methods report their savings on
  long schedules, where late epochs add little. Chosen by name only (not in ``all``): it
  is several times the main job.
* ``minilm-rt``: a pretrained transformer fine-tuned on Rotten Tomatoes review snippets
  (``finetune.py``); by name only: it is several times the main job, its packages installed apart.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from benchmarks.core import finetune

DATA_SEED = 42  # the dataset (its flipped labels, its duplicates) is the same for every run seed
LONG_EPOCHS = 32  # mnist1d-long: past 20 epochs, 10 more add about the seeds' spread (docs/benchmarks.md)


@dataclass
class TaskConfig:
    name: str
    n_train: int
    n_test: int
    epochs: int
    batch_size: int
    lr: float
    history: int
    sift_delay: int
    label_noise: float = 0.0
    weight_decay: float = 0.0
    warmup: float = 0.0  # share of each arm's own run with a linear lr warm-up before the cosine decay


TASKS: dict[str, TaskConfig] = {
    "mnist1d": TaskConfig("mnist1d", 40_000, 10_000, epochs=10, batch_size=128, lr=3e-3, history=4096, sift_delay=100),
    "mnist1d-noisy": TaskConfig(
        "mnist1d-noisy",
        40_000,
        10_000,
        epochs=10,
        batch_size=128,
        lr=3e-3,
        history=4096,
        sift_delay=100,
        label_noise=0.2,
    ),
    "mnist1d-redundant": TaskConfig(
        "mnist1d-redundant", 40_000, 10_000, epochs=10, batch_size=128, lr=3e-3, history=4096, sift_delay=100
    ),
    "bert": TaskConfig("bert", 8_000, 2_000, epochs=8, batch_size=64, lr=2e-3, history=2048, sift_delay=30, warmup=0.1),
    "digits": TaskConfig("digits", 1_437, 360, epochs=10, batch_size=32, lr=3e-3, history=512, sift_delay=10),
    "mnist1d-long": TaskConfig(
        "mnist1d-long", 40_000, 10_000, epochs=LONG_EPOCHS, batch_size=128, lr=3e-3, history=4096, sift_delay=100
    ),
    finetune.NAME: TaskConfig(
        finetune.NAME, 4_000, 1_500, epochs=5, batch_size=32, lr=1e-4, history=1024, sift_delay=40, warmup=0.1
    ),
}
# --tiny: seconds-long sizes, for the test that keeps the suite from rotting.
TINY: dict[str, dict[str, Any]] = {  # TaskConfig fields, by name
    "mnist1d": dict(n_train=2_000, n_test=500, epochs=2, sift_delay=5, history=512),
    "mnist1d-noisy": dict(n_train=2_000, n_test=500, epochs=2, sift_delay=5, history=512),
    "mnist1d-redundant": dict(n_train=2_000, n_test=500, epochs=2, sift_delay=5, history=512),
    "bert": dict(n_train=512, n_test=256, epochs=1, sift_delay=2, history=256),
    "digits": dict(epochs=2, sift_delay=5, history=256),
    "mnist1d-long": dict(n_train=2_000, n_test=500, epochs=4, sift_delay=5, history=512),
    finetune.NAME: dict(n_train=256, n_test=256, epochs=3, sift_delay=2, history=128),
}
TASK_ORDER = ("mnist1d", "mnist1d-noisy", "mnist1d-redundant", "bert", "digits")  # --task all
BY_NAME_ONLY = ("mnist1d-long", finetune.NAME)  # too long for all (and the latter installed apart): by name

# mnist1d-redundant: the share of distinct samples, the duplicated pool, the jitter
REDUNDANT_DISTINCT = 0.25
REDUNDANT_POOL = 0.025  # 1,000 of 40,000: each duplicated 30 times
REDUNDANT_JITTER = 0.05


@dataclass
class Data:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    mislabeled: torch.Tensor  # [n_train] bool: training label was flipped
    n_classes: int


def _flip_labels(y: torch.Tensor, share: float, n_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip ``round(share * n)`` labels, chosen uniformly, each to a different random class."""
    g = torch.Generator().manual_seed(seed + 1)
    n = y.shape[0]
    flip = torch.zeros(n, dtype=torch.bool)
    flip[torch.randperm(n, generator=g)[: round(share * n)]] = True
    offset = torch.randint(1, n_classes, (n,), generator=g)
    return torch.where(flip, (y + offset) % n_classes, y), flip


def mnist1d_data(n_train: int, n_test: int, cache: Path | None) -> Data:
    """MNIST-1D from ``mnist1d.data.make_dataset`` (generated locally: never ``get_dataset``,
    which downloads a pickle). Cached as .npz under ``cache`` (generating it is slow)."""
    n = n_train + n_test
    path = cache / f"mnist1d_n{n}_seed{DATA_SEED}.npz" if cache else None
    if path is not None and path.is_file():
        z = np.load(path)
        x, y, xt, yt = z["x"], z["y"], z["x_test"], z["y_test"]
    else:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = n
        args.train_split = n_train / n
        args.seed = DATA_SEED
        state = np.random.get_state()
        d = make_dataset(args)  # seeds numpy's and random's global generators
        np.random.set_state(state)
        x, y, xt, yt = d["x"], d["y"], d["x_test"], d["y_test"]
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, x=x, y=y, x_test=xt, y_test=yt)
    return Data(
        torch.tensor(x[:n_train], dtype=torch.float32),
        torch.tensor(y[:n_train], dtype=torch.int64),
        torch.tensor(xt[:n_test], dtype=torch.float32),
        torch.tensor(yt[:n_test], dtype=torch.int64),
        torch.zeros(min(n_train, len(y)), dtype=torch.bool),
        10,
    )


def make_redundant(data: Data, seed: int = DATA_SEED) -> Data:
    """Keep the first ``REDUNDANT_DISTINCT`` share of the training samples distinct; every
    other training sample becomes a jittered copy of one of a pool of ``REDUNDANT_POOL`` x n
    of the distinct ones (each pool sample duplicated equally often). Labels follow their
    originals; the sample count, the test set and the epochs are those of ``mnist1d``, so
    ``full`` costs the same as there."""
    n = data.x_train.shape[0]
    n_distinct = max(1, round(REDUNDANT_DISTINCT * n))
    pool = max(1, min(n_distinct, round(REDUNDANT_POOL * n)))
    g = torch.Generator().manual_seed(seed + 2)
    pool_ids = torch.randperm(n_distinct, generator=g)[:pool]
    src = pool_ids[torch.arange(n - n_distinct) % pool]
    src = src[torch.randperm(src.numel(), generator=g)]
    ids = torch.cat([torch.arange(n_distinct), src])
    x = data.x_train[ids].clone()
    x[n_distinct:] += REDUNDANT_JITTER * torch.randn(x[n_distinct:].shape, generator=g)
    order = torch.randperm(n, generator=g)  # duplicates spread through the data
    return Data(
        x[order], data.y_train[ids][order], data.x_test, data.y_test, torch.zeros(n, dtype=torch.bool), data.n_classes
    )


def digits_data(n_train: int, n_test: int) -> Data:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(DATA_SEED))
    x, y = x[perm], y[perm]
    n_train = min(n_train, len(y) - 1)
    n_test = min(n_test, len(y) - n_train)
    return Data(
        x[:n_train],
        y[:n_train],
        x[n_train : n_train + n_test],
        y[n_train : n_train + n_test],
        torch.zeros(n_train, dtype=torch.bool),
        10,
    )


BERT_VOCAB = 2048
BERT_LEN = 32
BERT_CLASSES = 4
BERT_CUES = 1600  # tokens 1..1600 are cue words; token t is evidence for class (t - 1) % 4
BERT_ZIPF = 1.1  # cue words of a class are drawn with probability ~ 1 / rank ** 1.1
BERT_CLOSE = 0.75  # the share of sequences in which the runner-up class has one cue word less


def cue_class(tokens: torch.Tensor) -> torch.Tensor:
    """The class a token is evidence for, -1 for [CLS] and filler tokens."""
    return torch.where((tokens >= 1) & (tokens <= BERT_CUES), (tokens - 1) % BERT_CLASSES, torch.full_like(tokens, -1))


def keyword_sequences(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of ``BERT_LEN`` tokens: a lexicon task, like sentiment classification.

    Tokens ``1..BERT_CUES`` are cue words, each evidence for one of ``BERT_CLASSES``
    classes (400 per class); tokens above are neutral filler; token 0 is [CLS] at position
    0. The label is the class with the most cue words in the sequence: it has 3 to 6; in
    a share ``BERT_CLOSE`` (three in four) of the sequences the runner-up class has exactly
    one less, in the others 0 to (winner - 1); the other classes 0 to (winner - 1). Within a class, cue words follow a
    Zipf law (probability ~ 1 / rank ** ``BERT_ZIPF``), as words do in text: the model has
    to learn the lexicon, its rare words late, and then count. Accuracy rises through the
    whole run instead of jumping to 100%.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(BERT_CUES + 1, BERT_VOCAB, (n, BERT_LEN), generator=g)
    y = torch.randint(0, BERT_CLASSES, (n,), generator=g)
    win = torch.randint(3, 7, (n,), generator=g)
    counts = (torch.rand(n, BERT_CLASSES, generator=g) * win.unsqueeze(1)).long()  # 0 .. win-1
    close = torch.rand(n, generator=g) < BERT_CLOSE
    runner = (y + torch.randint(1, BERT_CLASSES, (n,), generator=g)) % BERT_CLASSES
    rows = torch.arange(n)
    counts[rows[close], runner[close]] = win[close] - 1
    counts[rows, y] = win
    per_class = BERT_CUES // BERT_CLASSES
    zipf = 1.0 / torch.arange(1, per_class + 1, dtype=torch.float64) ** BERT_ZIPF
    total = counts.sum(dim=1)
    ranks = torch.multinomial(zipf, int(total.sum()), replacement=True, generator=g)
    classes = torch.repeat_interleave(torch.arange(BERT_CLASSES).repeat(n), counts.flatten())
    cues = 1 + classes + BERT_CLASSES * ranks
    start = 0
    for i in range(n):
        k = int(total[i])
        pos = torch.randperm(BERT_LEN - 1, generator=g)[:k] + 1
        x[i, pos] = cues[start : start + k]
        start += k
    x[:, 0] = 0
    return x, y


def bert_data(n_train: int, n_test: int) -> Data:
    x, y = keyword_sequences(n_train, DATA_SEED)
    xt, yt = keyword_sequences(n_test, DATA_SEED + 7)
    return Data(x, y, xt, yt, torch.zeros(n_train, dtype=torch.bool), BERT_CLASSES)


def make_data(task: TaskConfig, cache: Path | None) -> Data:
    if task.name.startswith("mnist1d"):
        data = mnist1d_data(task.n_train, task.n_test, cache)
        if task.name == "mnist1d-redundant":
            data = make_redundant(data)
    elif task.name == "digits":
        data = digits_data(task.n_train, task.n_test)
    elif task.name == "bert":
        data = bert_data(task.n_train, task.n_test)
    elif task.name == finetune.NAME:
        x, y, xt, yt = finetune.rotten_tomatoes(task.n_train, task.n_test, DATA_SEED)
        data = Data(x, y, xt, yt, torch.zeros(x.shape[0], dtype=torch.bool), len(finetune.LABELS))
    else:  # pragma: no cover - guarded by argparse
        raise ValueError(task.name)
    if task.label_noise > 0:
        data.y_train, data.mislabeled = _flip_labels(data.y_train, task.label_noise, data.n_classes, DATA_SEED)
    return data


class CNN1D(nn.Module):
    """The default model: three 1-D convolutions (32 channels) and a linear head, 40 -> 10."""

    def __init__(self, length: int = 40, channels: int = 32, n_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, channels, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(channels * ((length + 3) // 4), n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.unsqueeze(1))


class BertClassifier(nn.Module):
    """A small BERT (2 layers, hidden 64) from a config: no download, random init."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=BERT_VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            max_position_embeddings=BERT_LEN,
            hidden_dropout_prob=0.0,  # dropout on the attention would blur the count the label hangs on
            attention_probs_dropout_prob=0.0,
        )
        # a property (the length of id2label), not a field of every transformers' constructor
        config.num_labels = BERT_CLASSES
        self.bert = BertForSequenceClassification(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=x).logits


def make_model(task: TaskConfig) -> nn.Module:
    if task.name.startswith("mnist1d"):
        return CNN1D()
    if task.name == "digits":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    if task.name == "bert":
        return BertClassifier()
    if task.name == finetune.NAME:
        return finetune.MiniLMClassifier()
    raise ValueError(task.name)  # pragma: no cover


def model_description(task: TaskConfig) -> str:
    return {
        "mnist1d": "CNN1D conv(1-32,k5) conv(32-32,k3,s2) conv(32-32,k3,s2) linear(320-10)",
        "digits": "MLP 64-128-10",
        "bert": f"BertForSequenceClassification(hidden 64, 2 layers, 2 heads, ffn 128, no dropout, "
        f"vocab {BERT_VOCAB}, len {BERT_LEN})",
        finetune.NAME: finetune.MODEL_DESCRIPTION,
    }["mnist1d" if task.name.startswith("mnist1d") else task.name]


def task_sources(task: TaskConfig) -> dict[str, Any]:
    """Keys a task's records add to their config: the versions and checksums of what it installs apart."""
    return {"sources": finetune.sources()} if task.name == finetune.NAME else {}
