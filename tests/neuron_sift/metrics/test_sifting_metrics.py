"""The one metrics surface: ``collect_metrics`` -> ``SiftingMetrics``, log lines, TensorBoard."""

import contextlib
import io
import logging
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations.schedules import ExactLengthLoader
from neuron_sift.metrics import DEFAULT_QUANTILES, SiftingMetrics, collect_metrics, log_metrics, write_tensorboard
from neuron_sift.metrics.sifting_metrics import LOADER_LOGGER, find_sifting_loader
from tests.neuron_sift.integrations.readme_examples import example

pytestmark = pytest.mark.usefixtures("one_thread")


class CELoss(Loss):
    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


def make_loader(mode="probabilistic", n=240, batch_size=16, history=64, delay=2, device="cpu", beta=1.0):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g)
    model = torch.nn.Linear(10, 3).to(device)
    return SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=beta,
            loss_history_length=history,
            loss_based_sift_config={"sift_config": {"sift_delay": delay}},
            selection_mode=mode,
            seed=0,
        ),
        orig_dataloader=DataLoader(TensorDataset(x, y), batch_size=batch_size),
        loss_impl=CELoss(),
        model=model,
    )


def drain(loader, epochs=1):
    for _ in range(epochs):
        for _batch in loader:
            pass


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
def test_snapshot_agrees_with_the_loader(mode):
    loader = make_loader(mode, history=64)
    drain(loader, epochs=2)
    m = collect_metrics(loader)
    c = loader.counts
    assert isinstance(m, SiftingMetrics)
    assert m.counts == c.as_dict()
    assert (m.num_orig_samples_seen, m.num_orig_samples_kept) == (c.num_orig_samples_seen, c.num_orig_samples_kept)
    assert m.num_orig_samples_sifted == c.num_orig_samples_sifted > 0
    assert m.num_batches_emitted == c.num_batches_emitted and m.num_samples_pending == c.num_samples_pending
    assert m.observed_kept_share == pytest.approx(c.num_orig_samples_kept / c.num_orig_samples_seen)
    # The history wrapped (480 samples scored into 64 slots): every slot valid.
    state = loader.sifter.state
    assert m.history_fill == int(state.fill) == m.history_length == 64
    expected = torch.quantile(state.history[: m.history_fill], torch.tensor(DEFAULT_QUANTILES))
    assert list(m.history_quantiles) == list(DEFAULT_QUANTILES)
    assert list(m.history_quantiles.values()) == pytest.approx(expected.tolist())
    assert sorted(m.history_quantiles.values()) == list(m.history_quantiles.values())
    raw = loader.metrics()
    assert m.machinery_seconds == pytest.approx(raw["machinery_seconds"])
    assert m.scoring_seconds == pytest.approx(raw["timings"]["calculate_relevance_values"]["seconds"])
    assert m.scoring_seconds > 0
    sifted_sources = c.num_source_batches - c.num_source_batches_delayed
    assert m.machinery_latency == pytest.approx(m.machinery_seconds / sifted_sources)
    assert m.machinery_latency > 0
    sifted_batches = c.num_batches_emitted - c.num_source_batches_delayed
    assert m.batch_creation_latency == pytest.approx((m.machinery_seconds + m.scoring_seconds) / sifted_batches)
    assert m.compile_count is None and m.backend == "eager"
    assert m.selection_mode == mode and m.epoch == 1  # the second epoch, 0-based as in the logs and the epoch mode
    assert set(m.timings) >= {"transform", "calculate_relevance_values", "should_sift", "sift", "accumulate"}


def test_partly_filled_history_uses_only_the_valid_entries():
    loader = make_loader(n=48, batch_size=16, history=1000, delay=0)
    drain(loader)
    m = collect_metrics(loader, quantiles=(0.0, 0.5, 1.0))
    valid = loader.sifter.state.history[:48]
    assert m.history_fill == 48
    assert m.history_quantiles == pytest.approx(
        {0.0: valid.min().item(), 0.5: valid.quantile(0.5).item(), 1.0: valid.max().item()}
    )
    assert valid.min().item() > 0  # the zeros of the unused slots were not included


def test_before_any_scoring_there_are_no_quantiles():
    loader = make_loader(delay=100)
    drain(loader)  # every batch delayed: nothing scored
    m = collect_metrics(loader)
    assert m.history_fill == 0 and m.history_quantiles == {}
    assert m.observed_kept_share == 1.0 and m.machinery_latency == 0.0 and m.batch_creation_latency == 0.0
    assert not any(k.startswith("loss_history_q") for k in m.scalars())


def test_scalars_are_flat_numbers_with_a_prefix():
    loader = make_loader()
    drain(loader)
    m = collect_metrics(loader)
    scalars = m.scalars(prefix="sifting/")
    assert all(k.startswith("sifting/") for k in scalars)
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scalars.values())
    for name in (
        "num_orig_samples_seen",
        "num_orig_samples_kept",
        "observed_kept_share",
        "history_fill",
        "loss_history_q50",
        "loss_history_q10",
        "loss_history_q90",
        "machinery_seconds",
        "machinery_latency",
    ):
        assert "sifting/" + name in scalars
    assert scalars["sifting/loss_history_q50"] == m.history_quantiles[0.5]
    assert "sifting/compile_count" not in scalars  # eager backend
    assert m.as_dict()["history_quantiles"] == m.history_quantiles
    with pytest.raises(ValueError):
        collect_metrics(loader, quantiles=(1.5,))


def test_wrappers_are_resolved():
    loader = make_loader()
    drain(loader)

    class TrainerLike:
        sifting_dataloader = loader

    for wrapped in (ExactLengthLoader(loader, steps_per_epoch=2), [object(), loader], {"a": loader}, TrainerLike()):
        assert find_sifting_loader(wrapped) is loader
        assert collect_metrics(wrapped).counts == loader.counts.as_dict()
    with pytest.raises(TypeError):
        collect_metrics([1, 2])


def test_log_lines_on_the_loader_logger(caplog):
    loader = make_loader()
    drain(loader)
    caplog.set_level(logging.INFO, logger=LOADER_LOGGER)
    caplog.clear()
    m = log_metrics(loader)
    lines = [r.getMessage() for r in caplog.records if r.name == LOADER_LOGGER]
    text = "\n".join(lines)
    assert re.search(r"^num_orig_samples_seen: (\d+)$", text, re.M).group(1) == str(m.num_orig_samples_seen)
    assert re.search(r"^num_orig_samples_kept: (\d+)$", text, re.M).group(1) == str(m.num_orig_samples_kept)
    observed = float(re.search(r"^observed_kept_share: ([\d.]+)$", text, re.M).group(1))
    assert observed == pytest.approx(m.observed_kept_share, abs=1e-6)
    assert re.search(r"^loss_history_fill: (\d+)$", text, re.M).group(1) == str(m.history_fill)
    q50 = float(re.search(r"^loss_history_q50: (\S+)$", text, re.M).group(1))
    assert q50 == pytest.approx(m.history_quantiles[0.5], rel=1e-5)
    for name in ("sifting_machinery_seconds", "sifting_machinery_latency", "sifting_batch_creation_latency"):
        assert re.search(rf"^{name}: [\d.]+$", text, re.M)
    assert "xla_compile_count" not in text
    # Nothing is formatted when INFO is off.
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=LOADER_LOGGER)
    log_metrics(m)
    assert not [r for r in caplog.records if r.name == LOADER_LOGGER]


def test_write_tensorboard_to_a_directory(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    loader = make_loader()
    drain(loader)
    m = write_tensorboard(loader, tmp_path / "tb", global_step=7)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"sifting/observed_kept_share", "sifting/num_orig_samples_seen", "sifting/loss_history_q50"} <= tags
    (event,) = acc.Scalars("sifting/observed_kept_share")
    assert event.step == 7 and event.value == pytest.approx(m.observed_kept_share)
    (seen,) = acc.Scalars("sifting/num_orig_samples_seen")
    assert seen.value == m.num_orig_samples_seen


def test_write_tensorboard_to_a_writer_defaults_to_the_batch_count():
    class Writer:
        def __init__(self):
            self.calls = []

        def add_scalar(self, tag, value, step):
            self.calls.append((tag, value, step))

    loader = make_loader()
    drain(loader)
    writer = Writer()
    m = write_tensorboard(collect_metrics(loader), writer, prefix="s/")
    assert {step for _, _, step in writer.calls} == {m.num_batches_emitted}
    assert dict((tag, value) for tag, value, _ in writer.calls) == m.scalars("s/")


@pytest.mark.xla
def test_compile_count_on_the_xla_backend():
    import torch_xla
    import torch_xla.debug.metrics as met

    loader = make_loader("fixed", device=torch_xla.device(), n=96, batch_size=16, delay=0)
    drain(loader)
    m = collect_metrics(loader)
    assert m.backend == "xla"
    assert isinstance(m.compile_count, int) and m.compile_count >= 1
    assert m.compile_count == met.metric_data("CompileTime")[0]
    assert m.scalars()["compile_count"] == m.compile_count
    assert m.history_fill == 64 and len(m.history_quantiles) == len(DEFAULT_QUANTILES)
    assert m.num_orig_samples_seen == 96 and m.num_orig_samples_kept == 48


def test_readme_metrics_and_tensorboard_example(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger=LOADER_LOGGER)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example("Metrics and TensorBoard"), "README.md", "exec"), {"__name__": "__main__"})
    printed = out.getvalue()
    share = float(re.search(r"kept share: ([\d.]+)", printed).group(1))
    assert 0.2 < share < 0.5  # beta 2: about 1/3
    assert "loss-history median:" in printed
    logged = [r.getMessage() for r in caplog.records if r.name == LOADER_LOGGER]
    assert any(re.fullmatch(r"observed_kept_share: [\d.]+", line) for line in logged)
    assert any(re.fullmatch(r"loss_history_q50: \S+", line) for line in logged)
    assert list(Path("runs/sifting").glob("events.out.tfevents.*"))


def test_dropped_samples_reach_the_scalars():
    """A data-parallel rank's drops (simulated lagging peer) are a logged scalar."""
    from neuron_sift.metrics import collect_metrics
    from tests.neuron_sift.dataloader.test_pending import check_lagging_peer

    loader = check_lagging_peer("cpu", epochs=2)
    dropped = loader.counts.num_samples_dropped
    assert dropped > 0
    assert collect_metrics(loader).scalars("sifting/")["sifting/num_samples_dropped"] == dropped
