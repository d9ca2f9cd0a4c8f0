"""Lengths for learning-rate schedules: ``len(loader)``, ``batches_per_epoch``, ``planned_steps``, ``ExactLengthLoader``.

Fixed mode: the plan is exact, epoch by epoch and in total, through the delay and the
samples carried between epochs, so ``OneCycleLR(total_steps=planned_steps(...))`` ends
exactly. Probabilistic mode: a cosine schedule sized from the estimate ends within a few
batches of its plan (bounded by ``planned_steps_std``), ``OneCycleLR`` planned with
``sigmas=4`` never overshoots, and ``ExactLengthLoader`` makes any schedule exact.
"""

import contextlib
import io
import math

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from neuron_sift import Loss, SiftingDataloader
from neuron_sift.integrations.schedules import ExactLengthLoader, batches_per_epoch, planned_steps, planned_steps_std
from tests.neuron_sift.dataloader.fakes import Classifier, make_config
from tests.neuron_sift.integrations.readme_examples import example

pytestmark = pytest.mark.usefixtures("one_thread")


def config(mode, beta=1.0, delay=0, repeat=False, history=64, seed=0):
    return make_config(beta, history, delay, mode, repeat, seed)


class IdLoss(Loss):
    """Oracle loss: sample i's loss is stored next to it (i.i.d. losses, no model work)."""

    def loss(self, model, transformed_batch, original_batch=None):
        _ids, losses = original_batch
        return losses.float()


class RecordingSampler(torch.utils.data.Sampler):
    """A shuffling sampler with ``set_epoch``, recording the epochs it was given."""

    def __init__(self, n):
        self.n = n
        self.epochs = []
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epochs.append(epoch)
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(1000 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


class IdDataset(Dataset):
    def __init__(self, losses):
        self.losses = losses

    def __len__(self):
        return len(self.losses)

    def __getitem__(self, i):
        return torch.tensor(i), self.losses[i]


def oracle_loader(n, batch_size, cfg, seed=0, sampler=None, drop_last=False):
    losses = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    source = DataLoader(IdDataset(losses), batch_size=batch_size, sampler=sampler, drop_last=drop_last)
    return SiftingDataloader(sift_config=cfg, orig_dataloader=source, loss_impl=IdLoss(), model=torch.nn.Linear(1, 1))


def count_epoch(loader):
    return sum(1 for _ in loader)


# -- fixed mode: exact ------------------------------------------------------------------------


@pytest.mark.parametrize("delay,repeat", [(0, False), (3, False), (20, False), (3, True)])
@pytest.mark.parametrize(
    "n,batch_size,beta,drop_last", [(100, 8, 1.0, False), (203, 16, 2.0, False), (99, 10, 0.5, True)]
)
def test_fixed_plan_is_exact_epoch_by_epoch(delay, repeat, n, batch_size, beta, drop_last):
    epochs = 5
    fresh = oracle_loader(n, batch_size, config("fixed", beta, delay, repeat), drop_last=drop_last)
    plan = batches_per_epoch(fresh, epochs)
    total = planned_steps(fresh, epochs)
    loader = oracle_loader(n, batch_size, config("fixed", beta, delay, repeat), drop_last=drop_last)
    actual = []
    for _ in range(epochs):
        expected_now = len(loader)
        assert batches_per_epoch(loader, 1) == [expected_now]
        actual.append(count_epoch(loader))
        assert actual[-1] == expected_now
    assert plan == actual
    assert total == sum(actual)
    assert planned_steps_std(fresh, epochs) == 0.0
    assert planned_steps(fresh, epochs, sigmas=4) == total  # nothing random to allow for


def test_len_times_epochs_misses_what_planned_steps_gets_right():
    """Why planned_steps exists: the delay is in the first epoch only, carried samples add up."""
    loader = oracle_loader(100, 8, config("fixed", 1.0, delay=6))
    first = len(loader)
    total = planned_steps(loader, 4)
    actual = sum(count_epoch(loader) for _ in range(4))
    assert actual == total
    assert first * 4 != total


def test_fixed_one_cycle_ends_exactly_on_a_trained_model():
    torch.manual_seed(0)
    x = torch.randn(300, 10)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    class CE(Loss):
        def loss(self, model, transformed_batch, original_batch=None):
            xb, yb = original_batch
            return torch.nn.functional.cross_entropy(model(xb), yb, reduction="none")

    loader = SiftingDataloader(
        sift_config=config("fixed", beta=2.0, delay=4, history=128),
        orig_dataloader=DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True),
        loss_impl=CE(),
        model=model,
    )
    epochs = 4
    total = planned_steps(loader, epochs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    max_lr = 0.5
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=total)
    used = []
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            used.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
    assert scheduler.last_epoch == len(used) == total
    # The last step trained at the schedule's final value: initial / final_div_factor.
    assert used[-1] == pytest.approx(max_lr / 25 / 1e4)
    assert max(used) == pytest.approx(max_lr, rel=1e-3)
    with pytest.raises(ValueError):
        scheduler.step()  # one more step than planned would have raised inside the loop


# -- probabilistic mode: the estimate and its spread ---------------------------------------------


def test_probabilistic_plan_first_epoch_is_len():
    for delay, repeat in [(0, False), (5, False), (5, True)]:
        loader = oracle_loader(500, 16, config("probabilistic", 1.5, delay, repeat))
        for _ in range(3):
            assert batches_per_epoch(loader, 1) == [len(loader)]
            count_epoch(loader)


def test_probabilistic_spread_matches_planned_std():
    """Over 12 seeds of i.i.d. losses: every run within 4 sigma, and the spread is about sigma."""
    epochs, n, b = 3, 960, 16
    deviations = []
    sigma = None
    for seed in range(12):
        loader = oracle_loader(n, b, config("probabilistic", 1.0, history=128, seed=seed), seed=seed)
        expected = planned_steps(loader, epochs)
        sigma = planned_steps_std(loader, epochs)
        actual = sum(count_epoch(loader) for _ in range(epochs))
        deviations.append(actual - expected)
        assert abs(actual - expected) <= 4 * sigma + 1
    assert sigma == pytest.approx(math.sqrt(n * epochs * 0.25) / b)
    spread = torch.tensor(deviations, dtype=torch.float64).std().item()
    assert 0.3 * sigma <= spread <= 2.0 * sigma


class CELoss(Loss):
    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


def trained_run(seed, mode, make_scheduler, epochs, wrap=False, delay=0):
    """Train a real classifier with sifting and a schedule; returns (loader, scheduler, optimizer, steps)."""
    torch.manual_seed(seed)
    x = torch.randn(800, 10)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    model = Classifier()
    loader = SiftingDataloader(
        sift_config=config(mode, beta=1.0, delay=delay, history=256, seed=seed),
        orig_dataloader=DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
        loss_impl=CELoss(),
        model=model,
    )
    if wrap:
        loader = ExactLengthLoader(loader, epochs=epochs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    scheduler = make_scheduler(optimizer, loader)
    steps = 0
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            scheduler.step()
            steps += 1
    return loader, scheduler, optimizer, steps


def test_probabilistic_cosine_from_len_finishes_near_its_end():
    """A cosine schedule sized from len(loader) on a model that learns fast.

    Overshoot is bounded by the spread of the count (4 sigma + 2 batches). While the loss
    falls, new losses rank low against the history and fewer samples are kept than the
    i.i.d. estimate: here (history of 16 batches, fast learning) runs end up to 10% early,
    where the cosine is flat, so the learning rate still ends within 3% of its range.
    """
    epochs, base_lr = 5, 0.2
    for seed in range(3):
        plan = {}

        def cosine(optimizer, loader):
            plan["t_max"] = len(loader) * epochs  # the documented estimate, sift_delay 0
            plan["std"] = planned_steps_std(loader, epochs)
            assert plan["t_max"] == planned_steps(loader, epochs)
            return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=plan["t_max"])

        loader, _, optimizer, steps = trained_run(seed, "probabilistic", cosine, epochs)
        assert not loader.length_is_exact
        assert steps <= plan["t_max"] + 4 * plan["std"] + 2
        assert steps >= 0.9 * plan["t_max"]
        assert optimizer.param_groups[0]["lr"] < 0.03 * base_lr  # cosine ends flat: near its minimum


def test_probabilistic_one_cycle_planned_with_sigmas_never_overshoots():
    epochs = 4
    for seed in range(3):
        plan = {}

        def one_cycle(optimizer, loader):
            plan["total"] = planned_steps(loader, epochs, sigmas=4)
            plan["expected"] = planned_steps(loader, epochs)
            plan["std"] = planned_steps_std(loader, epochs)
            return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=plan["total"])

        _, scheduler, _, steps = trained_run(seed, "probabilistic", one_cycle, epochs)  # would raise past the end
        assert steps == scheduler.last_epoch <= plan["total"]
        assert plan["total"] - steps <= math.ceil(8 * plan["std"]) + 2  # the bound costs at most 8 sigma


# -- ExactLengthLoader --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
def test_exact_length_loader_one_cycle_is_exact(mode):
    epochs = 4

    def one_cycle(optimizer, loader):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=len(loader) * epochs)

    loader, scheduler, _, steps = trained_run(0, mode, one_cycle, epochs, wrap=True, delay=3)
    assert steps == scheduler.last_epoch == len(loader) * epochs
    assert loader.length_is_exact


def test_exact_length_loader_streams_passes_without_loss_or_repeats():
    n, b, epochs = 203, 8, 6
    sampler = RecordingSampler(n)
    sifting = oracle_loader(n, b, config("probabilistic", 2.0, delay=2, history=64), sampler=sampler)
    expected_total = planned_steps(sifting, epochs)
    loader = ExactLengthLoader(sifting, epochs=epochs)
    assert len(loader) == max(1, math.floor(expected_total / epochs + 0.5))
    assert loader.batch_size == b and len(loader.dataset) == n
    emitted = []
    for _ in range(epochs):
        batches = list(loader)
        assert len(batches) == len(loader)
        assert all(len(ids) == b for ids, _ in batches)
        emitted.extend(int(i) for ids, _ in batches for i in ids)
    c = sifting.counts
    assert len(emitted) == c.num_samples_emitted == len(loader) * epochs * b
    assert c.num_orig_samples_kept == c.num_samples_emitted + c.num_samples_pending
    # Passes: set_epoch(0), (1), ... once per pass, in order; every sample at most once per pass.
    assert sampler.epochs == list(range(loader.passes))
    assert max(emitted.count(i) for i in set(emitted)) <= loader.passes
    # The passes cover `epochs` passes over the data to within epochs / 2 batches (+ the last partial pass).
    assert abs(c.num_orig_samples_seen - n * epochs) <= (epochs / 2 + 1) * b * 3  # sifted share 1/3


def test_exact_length_loader_continues_a_pass_the_consumer_abandoned():
    sifting = oracle_loader(160, 8, config("fixed", 1.0))  # 10 batches per pass, exactly
    loader = ExactLengthLoader(sifting, steps_per_epoch=7)
    first = iter(loader)
    taken = [next(first) for _ in range(3)]  # the consumer stops early (e.g. max_steps reached)
    second = list(loader)  # the next epoch continues the same pass
    assert len(taken) == 3 and len(second) == 7
    assert loader.passes == 1 and sifting.counts.num_batches_emitted == 10
    third = list(loader)
    assert len(third) == 7 and loader.passes == 2


@pytest.mark.parametrize("mode", ["probabilistic", "fixed"])
def test_exact_length_loader_length_is_what_it_yields_on_an_empty_source(mode):
    loader = ExactLengthLoader(oracle_loader(0, 8, config(mode, 1.0)), epochs=3)
    assert len(loader) == 0
    for _ in range(3):
        assert list(loader) == []
    explicit = ExactLengthLoader(oracle_loader(0, 8, config(mode, 1.0)), steps_per_epoch=3)
    with pytest.raises(RuntimeError, match="yielded no sample"):
        list(explicit)


def test_exact_length_loader_validates():
    sifting = oracle_loader(64, 8, config("fixed", 1.0))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError):
            ExactLengthLoader(sifting, steps_per_epoch=bad)
    with pytest.raises(TypeError):
        ExactLengthLoader([1, 2, 3])
    with pytest.raises(ValueError):
        planned_steps(sifting, 0)


def test_planning_a_source_without_length_raises_type_error():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([(torch.tensor(i), torch.rand(())) for i in range(32)])

    sifting = SiftingDataloader(
        sift_config=config("fixed"),
        orig_dataloader=DataLoader(Stream(), batch_size=8),
        loss_impl=IdLoss(),
        model=torch.nn.Linear(1, 1),
    )
    with pytest.raises(TypeError):
        planned_steps(sifting, 2)


def test_readme_learning_rate_schedules_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example("Learning-rate schedules"), "README.md", "exec"), {"__name__": "__main__"})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    for line in lines:
        words = line.split()
        planned, ran = int(words[words.index("planned") + 1]), int(words[words.index("ran") + 1])
        assert planned == ran > 0
