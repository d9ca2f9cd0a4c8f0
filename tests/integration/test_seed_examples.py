"""The code examples of the two seed documents, run end to end on neuron_sift.

Each example is copied from ``/work/shared/seeds/`` with only the package name changed
(``smart_sifting`` -> ``neuron_sift``): that is the migration promise of
``spec/compat.md``. The class bodies below are verbatim. Edits to the web copies, all
outside the class bodies, are listed where they occur:

* seed 000 (Chinese blog, BERT example) lost its line breaks in the web copy; the code is
  re-broken into lines. The imports it elides with ``......`` (``Any``, ``torch``,
  ``SiftingBatch``, ``DataLoader``) come from seed 001's import lines, and its loader
  reads ``train``/``batch_size``/``model`` where the blog has ``self.train`` etc.
* seed 001 (German docs) lacks the commas in one parenthesised import list; they are
  added. Its placeholder line ``model=... # a PyTorch model`` is replaced by a real model
  built in each test.

The model is a tiny ``BertForSequenceClassification`` built from a config (nothing is
downloaded), wrapped so that ``model(batch)`` takes the seeds' list batch
``[input_ids, attention_mask, labels]`` and returns an object with ``.logits``, which is
what both seeds' loss classes call. The data is a synthetic, learnable token
classification task generated locally (see ``make_token_dataset``).
"""

# ---- test scaffolding (not from the seeds) ------------------------------------------------------
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch import Tensor  # noqa: F401
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForSequenceClassification

from neuron_sift.data_model.data_model_interface import SiftingBatch, SiftingBatchTransform
from neuron_sift.data_model.list_batch import ListBatch
from neuron_sift.data_model.tensor_batch import TensorBatch

# ---- seed 000, as printed. Its "......" hides the imports of Any, torch, SiftingBatch and
# DataLoader; seed 001's import lines below supply them. ------------------------------------------
from neuron_sift.dataloader.sift_dataloader import SiftingDataloader  # noqa: F811
from neuron_sift.loss.abstract_sift_loss_module import Loss  # noqa: F811

# ---- seed 001, as printed (several names repeat seed 000's on purpose). The commas of the
# first list are added: the web copy lost them, which is a SyntaxError. -----------------------------
from neuron_sift.sift_config.sift_configs import (  # noqa: F811
    LossConfig,
    RelativeProbabilisticSiftConfig,
    SiftingBaseConfig,
)

# The tiny model gains nothing from intra-op threads; on a shared 2-core CPU two threads
# spin against other processes (measured 10-20x slower).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


# =================================================================================================
# Seed 000 (verbatim class body; line breaks restored)
# =================================================================================================


## 定义筛选损失
class SiftBertLoss(Loss):
    # 您应该添加以下初始化函数
    # 以计算每个样本的损失，而不是每个批次
    def __init__(self):
        self.celoss = torch.nn.CrossEntropyLoss(reduction="none")

    def loss(
        self,
        model: torch.nn.Module,
        transformed_batch: SiftingBatch,
        original_batch: Any = None,
    ) -> torch.Tensor:
        device = next(model.parameters()).device
        batch = [t.to(device) for t in original_batch]
        # 计算损失
        outputs = model(batch)
        return self.celoss(outputs.logits, batch[2])


# =================================================================================================
# Seed 001 (verbatim class bodies)
# =================================================================================================


class ListBatchTransform(SiftingBatchTransform):
    def transform(self, batch: Any):
        inputs = batch[0].tolist()
        labels = batch[-1].tolist()  # assume the last one is the list of labels
        return ListBatch(inputs, labels)

    def reverse_transform(self, list_batch: ListBatch):
        a_batch = [torch.tensor(list_batch.inputs), torch.tensor(list_batch.labels)]
        return a_batch


class ListBatchTransformNoLabels(SiftingBatchTransform):
    def transform(self, batch: Any):
        return ListBatch(batch[0].tolist())

    def reverse_transform(self, list_batch: ListBatch):
        a_batch = [torch.tensor(list_batch.inputs)]
        return a_batch


class TensorBatchTransform(SiftingBatchTransform):
    def transform(self, batch: Any):
        a_tensor_batch = TensorBatch(batch[0], batch[-1])  # assume the last one is the list of labels
        return a_tensor_batch

    def reverse_transform(self, tensor_batch: TensorBatch):
        a_batch = [tensor_batch.inputs, tensor_batch.labels]
        return a_batch


class SiftingImplementedLoss(Loss):
    # You should add the following initializaztion function
    # to calculate loss per sample, not per batch.
    def __init__(self):
        self.loss_no_reduction = torch.nn.CrossEntropyLoss(reduction="none")

    def loss(
        self,
        model: torch.nn.Module,
        transformed_batch: SiftingBatch,
        original_batch: Any = None,
    ) -> torch.Tensor:
        device = next(model.parameters()).device
        batch = [t.to(device) for t in original_batch]  # use this if you use original batch and skipped step 2
        # batch = [t.to(device) for t in transformed_batch] # use this if you transformed batches in step 2

        # compute loss
        outputs = model(batch)
        return self.loss_no_reduction(outputs.logits, batch[2])


def seed001_sift_config():
    """Seed 001's config, verbatim."""
    sift_config = RelativeProbabilisticSiftConfig(
        beta_value=0.5,
        loss_history_length=500,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=0)),
    )
    return sift_config


# =================================================================================================
# Test scaffolding: model, data, checks (not from the seeds)
# =================================================================================================

PAD, CLS = 0, 1
VOCAB = 100
SEQ_LEN = 16
HALF = (VOCAB - 3) // 2  # content tokens are 3 .. 3 + 2 * HALF - 1
BATCH_SIZE = 16


class TinyBertListModel(nn.Module):
    """``model(batch)`` with ``batch = [input_ids, attention_mask, labels]``; returns ``.logits``.

    The labels (``batch[2]``) are ignored by the forward pass: the seeds' loss classes
    compute the loss from ``outputs.logits`` and ``batch[2]`` themselves.
    """

    def __init__(self):
        super().__init__()
        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            num_labels=2,
            pad_token_id=PAD,
        )
        self.bert = BertForSequenceClassification(config)

    def forward(self, batch):
        return self.bert(input_ids=batch[0], attention_mask=batch[1])


def make_token_dataset(n: int, seed: int, flip: float = 0.1):
    """A learnable, noisy binary task: label 0 draws tokens mostly from the lower half of the
    content vocabulary, label 1 mostly from the upper half (each token flips side with
    probability ``flip``). Sequences start with CLS, have 8..16 real tokens and are PAD-padded;
    the attention mask marks the real tokens. Returns ``(input_ids, attention_mask, labels)``."""
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=g) < 0.5).long()
    tok = torch.randint(0, HALF, (n, SEQ_LEN), generator=g)
    side = labels.unsqueeze(1) ^ (torch.rand(n, SEQ_LEN, generator=g) < flip).long()
    ids = 3 + tok + side * HALF
    ids[:, 0] = CLS
    lengths = torch.randint(8, SEQ_LEN + 1, (n,), generator=g)
    mask = (torch.arange(SEQ_LEN).unsqueeze(0) < lengths.unsqueeze(1)).long()
    ids = ids.masked_fill(mask == 0, PAD)
    return ids, mask, labels


class SampleIndex:
    """Looks a sample up by its token ids (unique in the generated data)."""

    def __init__(self, ids, mask, labels):
        self.rows = {tuple(r): i for i, r in enumerate(ids.tolist())}
        assert len(self.rows) == ids.shape[0], "generated token sequences must be unique"
        self.ids, self.mask, self.labels = ids, mask, labels

    def lookup(self, input_ids: torch.Tensor):
        out = []
        for r in input_ids.tolist():
            assert tuple(r) in self.rows, "an emitted sample is not a sample of the dataset"
            out.append(self.rows[tuple(r)])
        return torch.tensor(out, dtype=torch.long)


def eval_loss(model: nn.Module, data) -> float:
    ids, mask, labels = data
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model([ids, mask, labels]).logits
    model.train(was_training)
    return nn.functional.cross_entropy(logits, labels).item()


def params_copy(model: nn.Module):
    return [p.detach().clone() for p in model.parameters()]


def params_changed(model: nn.Module, before) -> bool:
    return any(not torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before))


def check_counts(loader: SiftingDataloader) -> None:
    c = loader.counts
    assert c.num_orig_samples_seen == c.num_orig_samples_kept + c.num_orig_samples_sifted
    assert c.num_orig_samples_kept == c.num_samples_emitted + c.num_samples_pending
    assert 0 <= c.num_samples_pending < BATCH_SIZE
    assert c.num_samples_emitted == c.num_batches_emitted * BATCH_SIZE


# =================================================================================================
# (a) seed 000: the BERT example
# =================================================================================================


def check_seed000_batch(batch, index: SampleIndex) -> None:
    """The user's own format: the list [input_ids, attention_mask, labels] of the source loader,
    full size, every row a whole sample of the dataset."""
    assert type(batch) is list and len(batch) == 3
    ids, mask, labels = batch
    assert ids.shape == (BATCH_SIZE, SEQ_LEN) and ids.dtype == torch.long
    assert mask.shape == (BATCH_SIZE, SEQ_LEN) and mask.dtype == torch.long
    assert labels.shape == (BATCH_SIZE,) and labels.dtype == torch.long
    rows = index.lookup(ids)
    assert torch.equal(mask, index.mask[rows]) and torch.equal(labels, index.labels[rows])


def test_seed000_bert_example_trains_and_sifts():
    n_source = 60  # source batches per epoch; sifting starts after the first 10 (sift_delay=10)
    n_train = n_source * BATCH_SIZE
    train = TensorDataset(*make_token_dataset(n_train, seed=1))
    test = make_token_dataset(256, seed=2)
    index = SampleIndex(*train.tensors)
    model = TinyBertListModel()
    batch_size = BATCH_SIZE

    # -- the seed's config and loader, verbatim but for `self.` --
    sift_config = RelativeProbabilisticSiftConfig(
        beta_value=3,
        loss_history_length=500,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=10)),
    )
    train_dataloader = SiftingDataloader(
        sift_config=sift_config,
        orig_dataloader=DataLoader(train, batch_size, shuffle=True),
        loss_impl=SiftBertLoss(),
        model=model,
    )

    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    criterion = nn.CrossEntropyLoss()
    loss_before = eval_loss(model, test)
    before = params_copy(model)
    emitted_per_epoch = []
    epochs = 4
    for _ in range(epochs):
        model.train()
        n_emitted = 0
        for batch in train_dataloader:
            check_seed000_batch(batch, index)
            assert model.training, "the scoring pass must restore train mode"
            outputs = model(batch)
            loss = criterion(outputs.logits, batch[2])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n_emitted += 1
            check_counts(train_dataloader)
        emitted_per_epoch.append(n_emitted)

    c = train_dataloader.counts
    assert c.num_source_batches == epochs * n_source
    assert c.num_source_batches_delayed == 10
    assert c.num_orig_samples_seen == epochs * n_train
    assert c.num_batches_emitted == sum(emitted_per_epoch)
    delayed = 10 * BATCH_SIZE
    kept_while_training = (c.num_orig_samples_kept - delayed) / (c.num_orig_samples_seen - delayed)
    # While the model learns, its losses keep falling, so new losses rank low against a
    # history filled before the last optimizer steps: the share falls well below the
    # stationary 25 % (measured 5-10 % here). Only a loose sanity band is asserted.
    assert 0.02 < kept_while_training < 0.40, kept_while_training
    assert emitted_per_epoch[-1] < 0.5 * n_source, emitted_per_epoch
    # Real training happened on the emitted batches.
    assert params_changed(model, before)
    loss_after = eval_loss(model, test)
    assert loss_after < loss_before - 0.25, (loss_before, loss_after)

    # With the model fixed (iterate without optimizer steps), the loss distribution is
    # stationary and the documented rule applies: kept share ~ 1 / (1 + beta) = 25 %
    # (a little less at first, while the history still holds losses of earlier weights).
    kept0, seen0 = c.num_orig_samples_kept, c.num_orig_samples_seen
    frozen = params_copy(model)
    for _ in range(2):
        for batch in train_dataloader:
            check_seed000_batch(batch, index)
            check_counts(train_dataloader)
    assert not params_changed(model, frozen), "the scoring pass must not change the model"
    kept_frozen = (c.num_orig_samples_kept - kept0) / (c.num_orig_samples_seen - seen0)
    assert 0.17 < kept_frozen < 0.33, kept_frozen


# =================================================================================================
# (b) seed 001: the three batch transforms with the seed's loss and config
# =================================================================================================


@pytest.mark.parametrize("transform_cls", [ListBatchTransform, TensorBatchTransform])
def test_seed001_transform_with_labels_trains(transform_cls):
    n_train = 40 * BATCH_SIZE
    data = make_token_dataset(n_train, seed=3)
    test = make_token_dataset(256, seed=4)
    index = SampleIndex(*data)
    model = TinyBertListModel()
    sift_config = seed001_sift_config()

    # -- seed 001's loader, verbatim: the source loader yields [inputs, mask, labels] --
    train_dataloader = DataLoader(TensorDataset(*data), BATCH_SIZE, shuffle=True)  # PyTorch data loader

    # Wrap the PyTorch data loader by SiftingDataloder
    train_dataloader = SiftingDataloader(
        sift_config=sift_config,  # config object of RelativeProbabilisticSiftConfig
        orig_dataloader=train_dataloader,
        batch_transforms=transform_cls(),  # Optional, this is the custom class from step 2
        loss_impl=SiftingImplementedLoss(),  # PyTorch loss function wrapped by the Sifting Loss interface
        model=model,
        log_batch_data=False,
    )

    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    criterion = nn.CrossEntropyLoss()
    loss_before = eval_loss(model, test)
    before = params_copy(model)
    epochs = 2
    for _ in range(epochs):
        model.train()
        for batch in train_dataloader:
            # The seed's reverse_transform returns [inputs, labels]: the mask is not carried.
            assert type(batch) is list and len(batch) == 2
            inputs, labels = batch
            assert inputs.shape == (BATCH_SIZE, SEQ_LEN) and inputs.dtype == torch.long
            assert labels.shape == (BATCH_SIZE,) and labels.dtype == torch.long
            rows = index.lookup(inputs)
            assert torch.equal(labels, index.labels[rows]), "labels must stay with their inputs"
            # The training loop rebuilds the attention mask from the padding (exact for this data).
            mask = (inputs != PAD).long()
            assert torch.equal(mask, index.mask[rows])

            outputs = model([inputs, mask, labels])
            loss = criterion(outputs.logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            check_counts(train_dataloader)

    c = train_dataloader.counts
    assert c.num_source_batches == epochs * 40 and c.num_source_batches_delayed == 0
    assert c.num_orig_samples_seen == epochs * n_train
    kept_share = c.num_orig_samples_kept / c.num_orig_samples_seen
    # beta=0.5: 1 / 1.5 = 66.7 % for a stationary loss distribution. This model learns
    # fast, its losses fall below the history and the share drifts down (measured 28-38 %
    # here); only a loose sanity band is asserted. The stationary share is checked in
    # test_seed001_transform_without_labels_emits_inputs_only (and for beta=3 in the seed 000 test).
    assert 0.10 < kept_share < 0.85, kept_share
    assert c.num_orig_samples_sifted > 0
    assert params_changed(model, before)
    loss_after = eval_loss(model, test)
    assert loss_after < loss_before - 0.15, (loss_before, loss_after)


def test_seed001_transform_without_labels_emits_inputs_only():
    """``ListBatchTransformNoLabels``: the emitted batches are ``[inputs]`` only, so the
    training loop has no labels to train on. What is checked instead: the format, that
    every emitted row is a real sample, that scoring (which reads the labels of the
    *original* batch, as the seed's loss does) ran and sifted, that it left the model
    untouched, and that the kept samples are biased towards high loss, as sifting should be
    (the model is fixed here, so each sample's loss is known in advance)."""
    n_train = 40 * BATCH_SIZE
    data = make_token_dataset(n_train, seed=5)
    index = SampleIndex(*data)
    model = TinyBertListModel()
    # Give the model some signal first, so per-sample losses are spread out.
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for ids, mask, labels in DataLoader(TensorDataset(*data), BATCH_SIZE, shuffle=True):
        loss = nn.functional.cross_entropy(model([ids, mask, labels]).logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.train()
    before = params_copy(model)
    model.eval()
    with torch.no_grad():
        per_sample = nn.functional.cross_entropy(model(list(data)).logits, data[2], reduction="none")
    model.train()
    # rank of each sample's loss among all samples, in [0, 1)
    pct_of_row = torch.empty(n_train)
    pct_of_row[torch.argsort(per_sample)] = torch.arange(n_train, dtype=torch.float32) / n_train

    sift_config = seed001_sift_config()
    train_dataloader = SiftingDataloader(
        sift_config=sift_config,
        orig_dataloader=DataLoader(TensorDataset(*data), BATCH_SIZE, shuffle=True),
        batch_transforms=ListBatchTransformNoLabels(),
        loss_impl=SiftingImplementedLoss(),
        model=model,
        log_batch_data=False,
    )
    emitted_rows = []
    epochs = 3
    for _ in range(epochs):
        for batch in train_dataloader:
            assert type(batch) is list and len(batch) == 1
            (inputs,) = batch
            assert inputs.shape == (BATCH_SIZE, SEQ_LEN) and inputs.dtype == torch.long
            emitted_rows.append(index.lookup(inputs))
            assert model.training
            check_counts(train_dataloader)

    assert not params_changed(model, before), "scoring must not change the model"
    c = train_dataloader.counts
    assert c.num_orig_samples_seen == epochs * n_train
    kept_share = c.num_orig_samples_kept / c.num_orig_samples_seen
    # Fixed model: the loss distribution is stationary, so the share should be close to 2/3.
    assert 0.58 < kept_share < 0.75, kept_share
    rows = torch.cat(emitted_rows)
    # Each sample is seen once per epoch, so it can be emitted at most `epochs` times.
    assert int(torch.bincount(rows, minlength=n_train).max()) <= epochs
    # Keep probability pct ** 0.5: a kept sample's expected loss rank is 0.6, not 0.5.
    mean_rank = pct_of_row[rows].mean().item()
    assert mean_rank > 0.56, mean_rank
