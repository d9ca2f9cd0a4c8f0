"""Property-based tests: random batch structures, sizes, configs and loss vectors.

Whatever hypothesis draws, every source sample is counted exactly once as kept or sifted,
every emitted batch has the source batch size, kept samples are emitted or pending (never
lost, never duplicated within an epoch), non-finite losses are never silently dropped,
the history never holds a non-finite value, and the only exception is the documented one
(fixed mode with round(B / (1 + beta)) == 0).
"""

import math
from collections import Counter, namedtuple

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from neuron_sift import (
    RelativeProbabilisticSiftConfig,
    SiftConfigValidationException,
    SiftingDataloader,
    UnsupportedDataFormatException,
)

Pair = namedtuple("Pair", ["left", "right"])

LOSS_VALUES = st.one_of(
    st.sampled_from([0.0, 1.0, 2.5, 1e30, -1e30, math.inf, -math.inf, math.nan]),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
)

# A payload template: how each sample's extra fields look (ids are mixed in so contents are checkable).
LEAF = st.sampled_from(["scalar", "vector", "string", "matrix"])
TEMPLATE = st.recursive(
    LEAF,
    lambda children: st.one_of(
        st.dictionaries(st.sampled_from(["a", "b", "c"]), children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.tuples(children, children).map(lambda t: ("pair",) + t),
    ),
    max_leaves=5,
)


def build_payload(template, i):
    if template == "scalar":
        return torch.tensor(float(i))
    if template == "vector":
        return torch.tensor([i, 2 * i])
    if template == "string":
        return f"s{i}"
    if template == "matrix":
        return torch.full((2, 3), float(i))
    if isinstance(template, dict):
        return {k: build_payload(v, i) for k, v in template.items()}
    if template[0] == "pair":
        return Pair(build_payload(template[1], i), build_payload(template[2], i))
    return tuple(build_payload(t, i) for t in template)


class Samples(Dataset):
    def __init__(self, n, template, top):
        self.n, self.template, self.top = n, template, top

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        payload = build_payload(self.template, i)
        if self.top == "dict":
            return {"id": torch.tensor(i), "payload": payload}
        return (torch.tensor(i), payload)


def ids_of(batch, top):
    return (batch["id"] if top == "dict" else batch[0]).tolist()


class TableLoss:
    def __init__(self, values, top):
        self.values, self.top = torch.tensor(values, dtype=torch.float64), top
        self.scored = []  # ids of every scored source batch

    def loss(self, model, transformed_batch, original_batch=None):
        ids = ids_of(original_batch, self.top)
        self.scored.append(ids)
        return self.values[torch.as_tensor(ids)].float()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(0, 70),
    batch_size=st.integers(1, 12),
    beta=st.floats(0.05, 50.0),
    history=st.integers(1, 40),
    delay=st.integers(0, 3),
    repeat=st.booleans(),
    mode=st.sampled_from(["probabilistic", "fixed"]),
    epochs=st.integers(1, 3),
    template=TEMPLATE,
    top=st.sampled_from(["dict", "tuple"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_sifting_invariants(data, n, batch_size, beta, history, delay, repeat, mode, epochs, template, top, seed):
    losses = data.draw(st.lists(LOSS_VALUES, min_size=n, max_size=n))
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=beta,
            loss_history_length=history,
            loss_based_sift_config={"sift_config": {"sift_delay": delay, "repeat_delay_per_epoch": repeat}},
            selection_mode=mode,
            seed=seed,
        ),
        orig_dataloader=DataLoader(Samples(n, template, top), batch_size=batch_size, shuffle=n > 0),
        loss_impl=TableLoss(losses, top),
        model=torch.nn.Linear(1, 1),
    )
    fixed_keeps_nothing = mode == "fixed" and math.floor(batch_size / (1 + beta) + 0.5) == 0
    emitted = []
    try:
        for _ in range(epochs):
            delayed = loader.counts.num_source_batches_delayed
            for batch in loader:
                ids = ids_of(batch, top)
                if loader.counts.num_source_batches_delayed > delayed:  # passed through during sift_delay
                    delayed = loader.counts.num_source_batches_delayed
                    assert 1 <= len(ids) <= batch_size
                else:
                    assert len(ids) == batch_size
                check_contents(batch, top, template)
                emitted.extend(ids)
    except SiftConfigValidationException:
        assert fixed_keeps_nothing and n > 0  # raised at the first scored batch
        return
    except UnsupportedDataFormatException as exc:
        # Documented: a list that could hold samples or fields of equally many samples.
        assert "Both dimension 0 and dimension 1 match batch size" in str(exc)
        # The top-level [ids, payload] list is 2 fields; with 2 samples per batch it is also 2 samples.
        assert top == "tuple" and 2 in (batch_size, min(n, batch_size)), (template, top, n, batch_size)
        return
    c = loader.counts
    assert c.num_orig_samples_seen == n * epochs
    assert c.num_orig_samples_seen == c.num_orig_samples_kept + c.num_orig_samples_sifted
    assert c.num_orig_samples_kept == c.num_samples_emitted + c.num_samples_pending == len(emitted) + loader.num_pending
    pending = loader.pending_batch()
    kept = emitted + ([] if pending is None else ids_of(pending.to_user(), top))
    counts = Counter(kept)
    assert all(v <= epochs for v in counts.values())
    assert torch.isfinite(loader.sifter.state.history).all()
    nonfinite = {i for i, v in enumerate(losses) if not math.isfinite(v)}
    if mode == "probabilistic":
        assert all(counts[i] == epochs for i in nonfinite)  # never silently dropped
    else:
        # Fixed mode keeps exactly k per batch, non-finite rows first: every one of them
        # while a batch has at most k, then k of them.
        expected = sum(
            min(sum(i in nonfinite for i in ids), loader.sifter.rows_taken(len(ids), batch_size))
            for ids in loader.loss_impl.scored
        )
        scored = sum(sum(i in nonfinite for i in ids) for ids in loader.loss_impl.scored)
        passed_through = epochs * len(nonfinite) - scored  # sift_delay batches
        assert sum(counts[i] for i in nonfinite) == expected + passed_through
    m = loader.metrics()
    assert m["device_num_kept"] + (c.num_orig_samples_seen - m["device_num_scored"]) == c.num_orig_samples_kept


def check_contents(batch, top, template):
    """The emitted batch equals the DataLoader's own collation of exactly those samples."""
    ids = ids_of(batch, top)
    dataset = Samples(max(ids) + 1, template, top)
    assert_same(batch, torch.utils.data.default_collate([dataset[i] for i in ids]))


def assert_same(got, want):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    else:
        assert got == want
