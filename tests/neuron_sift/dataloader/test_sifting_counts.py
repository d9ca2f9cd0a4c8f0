"""``SiftingCounts``: the per-batch loader's counts on the package's ``CountSet``."""

import pytest

from neuron_sift import SiftingCounts


def test_counts_not_bound_to_a_loader_read_zero_non_finite():
    counts = SiftingCounts(num_orig_samples_seen=10, num_orig_samples_kept=4)
    assert counts.num_nonfinite_losses == 0
    assert counts.as_dict()["num_nonfinite_losses"] == 0
    assert list(counts.as_dict()) == list(counts.names())
    assert counts.observed_kept_share == pytest.approx(0.4)
    assert SiftingCounts().observed_kept_share == 0.0


def test_the_state_keeps_the_engines_count_for_readers_and_restores_only_the_host_counts():
    counts = SiftingCounts(num_source_batches=3)
    counts.bind_nonfinite(lambda: 7)
    state = counts.state_dict()
    assert state["num_nonfinite_losses"] == 7 and state["num_source_batches"] == 3
    again = SiftingCounts()
    again.load_state_dict(state)
    assert again.num_source_batches == 3 and again.num_nonfinite_losses == 0  # the engine's, not the state's
    assert "num_nonfinite_losses" not in again.host_names()


def test_unknown_or_missing_counts_are_refused():
    state = SiftingCounts().state_dict()
    with pytest.raises(ValueError, match="unknown count"):
        SiftingCounts().load_state_dict({**state, "num_typos": 1})
    del state["num_samples_pending"]
    with pytest.raises(ValueError, match="no count num_samples_pending"):
        SiftingCounts().load_state_dict(state)
