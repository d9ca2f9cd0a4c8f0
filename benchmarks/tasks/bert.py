"""``bert``: generated token sequences of a lexicon task (``keyword_sequences``) and a small
BERT that classifies them (the task and its versions are described in ``registry.py``)."""

import torch
import torch.nn as nn

from benchmarks.tasks.data import DATA_SEED, Data

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
