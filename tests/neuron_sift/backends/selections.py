"""Comparing the selections of two implementations of the sifting step.

Bitwise equality holds only between results of the same computation on the same device.
The step's keep decisions are discrete, but they compare float values that other
implementations (XLA's graphs, inductor's code, CUDA's kernels) compute with ``pow`` and
``log`` of their own, which may round the last bit differently from ATen's eager kernels;
which of them does depends on the CPU's instruction set or the device. A sample whose
decision sits within that rounding of its threshold can go either way, so two such runs
are compared epoch by epoch with a stated tolerance instead.
"""

from collections import Counter


def per_epoch_ids(loader, epochs):
    """The ids of every emitted batch, one list of batches per epoch."""
    return [[ids.cpu().tolist() for ids, _ in loader] for _ in range(epochs)]


def assert_same_selections(got, want, mode, share=0.01):
    """``got`` and ``want`` (per-epoch lists of emitted id batches) kept the same samples,
    up to a few decisions within rounding of their threshold: per epoch, the kept samples (a
    multiset: samples still pending at an epoch's end are emitted in the next) differ by at
    most ``share`` of them (and at most 2 below 200 kept); the batch counts differ by at most
    one, and not at all in fixed mode, whose counts never depend on values."""
    assert len(got) == len(want), "different numbers of epochs"
    for epoch, (a, b) in enumerate(zip(got, want)):
        kept_a = Counter(i for ids in a for i in ids)
        kept_b = Counter(i for ids in b for i in ids)
        if mode == "fixed":
            assert len(a) == len(b) and kept_a.total() == kept_b.total(), f"epoch {epoch}: fixed mode's counts differ"
        assert abs(len(a) - len(b)) <= 1, f"epoch {epoch}: {len(a)} batches against {len(b)}"
        differ = ((kept_a - kept_b) + (kept_b - kept_a)).total()
        allowed = max(2, int(share * kept_b.total()))
        assert differ <= allowed, f"epoch {epoch}: {differ} of {kept_b.total()} kept samples differ (at most {allowed})"
