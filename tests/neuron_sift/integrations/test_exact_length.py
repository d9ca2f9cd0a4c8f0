"""``ExactLengthLoader`` around the epoch loader (its per-batch side is tested in
tests/neuron_sift/integrations/test_schedules.py and test_resume_training.py) and the length
functions for either loader."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuron_sift import EpochSiftingDataloader, Loss, RelativeProbabilisticSiftConfig, SiftingDataloader
from neuron_sift.integrations.schedules import ExactLengthLoader, batches_per_epoch, planned_steps


def epoch_loader(n=100, batch=8, epochs=5):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    ids = torch.arange(n)
    return EpochSiftingDataloader(
        {"seed": 0, "kept_share": 0.5, "start_rank_correlation": None},  # pruning from epoch 1: exact lengths
        DataLoader(TensorDataset(x, ids), batch_size=batch),
        num_epochs=epochs,
    )


def train(stream, epochs, per_step=1):
    """Consume ``epochs`` epochs of ``stream``, recording losses ``per_step`` batches at a time
    (a Trainer's gradient accumulation look-ahead); returns each epoch's batches' sample ids."""
    loader = stream.loader
    out = []
    for _ in range(epochs):
        it, ids = iter(stream), []
        while True:
            group = [b for _, b in zip(range(per_step), it)]
            if not group:
                break
            for x, i in group:
                loader.weighted_loss(F.mse_loss(x, torch.zeros_like(x), reduction="none").mean(1) + i.float())
                ids.append(i.tolist())
        out.append(ids)
    return out


def test_every_epoch_is_exactly_len_batches_across_planned_epochs():
    loader = epoch_loader()
    stream = ExactLengthLoader(loader, epochs=5)
    assert stream.epoch_sifting_dataloader is loader and stream.sifting_dataloader is None
    assert len(stream) == loader.planned_steps() // 5
    trained = train(stream, 5, per_step=3)
    assert [len(batches) for batches in trained] == [len(stream)] * 5
    m = loader.metrics()
    assert m["unpaired_batches"] == 0 and loader.counts["batches_recorded"] == 5 * len(stream)
    assert planned_steps(loader, None) == loader.planned_steps() < 5  # the last < 5 batches of the plan are left out


def test_a_resumed_stream_trains_the_batches_of_the_uninterrupted_run():
    full = ExactLengthLoader(epoch_loader(), epochs=5)
    expected = train(full, 5)
    first = ExactLengthLoader(epoch_loader(), epochs=5)
    before = train(first, 2)
    state = first.state_dict()
    assert state["kind"] == "ExactLengthLoader" and state["loader"]["kind"] == "EpochSiftingDataloader"
    resumed = ExactLengthLoader(epoch_loader(), epochs=5)
    resumed.load_state_dict(state)
    assert before + train(resumed, 3) == expected


@pytest.mark.parametrize("mode", ["epoch", "per-batch"])
def test_a_newer_iteration_voids_the_older_one(mode):
    """The shared lifetime rule around either loader: a peek's iterator is void once the loop
    starts its own, and the loop then takes a whole epoch."""
    stream = ExactLengthLoader(epoch_loader() if mode == "epoch" else per_batch_loader(), epochs=5)
    old = iter(stream)
    next(old)
    new = iter(stream)
    with pytest.raises(RuntimeError, match="ExactLengthLoader: a new iteration was started"):
        next(old)
    if mode == "per-batch":  # the epoch loader pairs losses: its loop is train() above
        assert len(list(new)) == len(stream)


class Score(Loss):
    def loss(self, model, transformed_batch, original_batch=None):
        return transformed_batch[0].float()


def per_batch_loader():
    cfg = RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=8, selection_mode="fixed", seed=0)
    source = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8)
    return SiftingDataloader(sift_config=cfg, orig_dataloader=source, loss_impl=Score(), model=torch.nn.Identity())


def test_planned_steps_answers_for_either_loader():
    sifting = per_batch_loader()
    assert planned_steps(sifting, 3) == sum(batches_per_epoch(sifting, 3))
    assert planned_steps(ExactLengthLoader(sifting), 3) == planned_steps(sifting, 3)
    loader = epoch_loader()
    assert planned_steps(loader, 2) == loader.planned_steps(2)
    assert planned_steps(loader, None) == planned_steps(ExactLengthLoader(loader, 3), None) == loader.planned_steps()
    with pytest.raises(ValueError, match="needs a number of epochs"):
        planned_steps(sifting, None)
    with pytest.raises(TypeError, match="expected a SiftingDataloader or an EpochSiftingDataloader"):
        planned_steps([1, 2], 1)
    with pytest.raises(TypeError, match="expected a SiftingDataloader"):
        batches_per_epoch(loader, 1)  # per-batch counts: the epoch loader's are its plans


def test_a_state_taken_after_an_epochs_last_batch_resumes_its_empty_rest_or_closed_the_next_epoch():
    """What a Trainer's checkpoint at an epoch's end holds: the last batch yielded, the
    iteration not yet ended. Loaded as it is, the next ``iter()`` yields that epoch's empty
    rest (a loop of the user's own, which still counts the epoch, goes on right); closed
    with ``closed_epoch`` (what the Trainer and Lightning integrations load), it yields the
    uninterrupted run's next epoch."""
    from neuron_sift.integrations.exact_length import closed_epoch

    expected = train(ExactLengthLoader(epoch_loader(), epochs=5), 5)
    first = ExactLengthLoader(epoch_loader(), epochs=5)
    train(first, 1)
    it = iter(first)
    for _ in range(len(first)):
        x, i = next(it)
        first.loader.weighted_loss(F.mse_loss(x, torch.zeros_like(x), reduction="none").mean(1) + i.float())
    state = first.state_dict()
    assert state["epoch_yielded"] == len(first)
    as_saved = ExactLengthLoader(epoch_loader(), epochs=5)
    as_saved.load_state_dict(state)
    assert train(as_saved, 4) == [[], *expected[2:]]
    closed = ExactLengthLoader(epoch_loader(), epochs=5)
    closed.load_state_dict(closed_epoch(state))
    assert closed_epoch(state)["epoch_yielded"] is None
    assert train(closed, 3) == expected[2:]


def accumulated_steps(stream, epochs, per_step, start_epoch=0, saves=None):
    """The Hugging Face Trainer's loop with gradient accumulation: each epoch announced
    (``set_epoch``), then optimizer steps that pull ``per_step`` batches (the epoch's rest at
    its end: a short last step), exactly ``len()`` batches in all, then record their losses.
    Returns each step's (epoch, ids); ``saves``, when given, gets (the epoch a resume starts
    in, state) after every step, as a Trainer that checkpoints each step (after an epoch's
    last step it resumes into the next epoch)."""
    loader, steps = stream.loader, []
    for epoch in range(start_epoch, epochs):
        stream.set_epoch(epoch)
        left = len(stream)
        it = iter(stream)
        while left:
            group = [next(it) for _ in range(min(per_step, left))]
            left -= len(group)
            for x, i in group:
                loader.weighted_loss(F.mse_loss(x, torch.zeros_like(x), reduction="none").mean(1) + i.float())
            steps.append((epoch, [i.tolist() for _, i in group]))
            if saves is not None:
                saves.append((epoch if left else epoch + 1, stream.state_dict()))
    return steps


@pytest.mark.parametrize(("per_step", "epochs"), [(2, 3), (3, 5)])
def test_gradient_accumulation_resumes_from_every_step_with_short_last_steps(per_step, epochs):
    """Every Trainer epoch ends on a short optimizer step (9 batches in steps of 2, 8 in steps
    of 3); resumed from the checkpoint after any step, the run trains the uninterrupted run's
    remaining batches. Before 0.9.0 a resume just before a short step learned a look-ahead of
    1 from it and refused the next epoch's full step ("holds at most 1 batch(es)")."""
    saves = []
    full = accumulated_steps(
        ExactLengthLoader(epoch_loader(epochs=epochs), epochs=epochs), epochs, per_step, saves=saves
    )
    stream = ExactLengthLoader(epoch_loader(epochs=epochs), epochs=epochs)
    assert len(stream) % per_step != 0  # each epoch ends on a short step
    for done, (epoch, state) in enumerate(saves, start=1):
        resumed = ExactLengthLoader(epoch_loader(epochs=epochs), epochs=epochs)
        resumed.load_state_dict(state)
        assert accumulated_steps(resumed, epochs, per_step, start_epoch=epoch) == full[done:], done


def after_last_batch_of_epoch(epoch, epochs=5):
    """An ExactLengthLoader's state after the last batch of ``epoch`` (0-based), its iteration not
    yet ended: what a checkpoint every ``k`` steps holds sooner or later."""
    stream = ExactLengthLoader(epoch_loader(epochs=epochs), epochs=epochs)
    train(stream, epoch)
    it = iter(stream)
    for _ in range(len(stream)):
        x, i = next(it)
        stream.loader.weighted_loss(F.mse_loss(x, torch.zeros_like(x), reduction="none").mean(1) + i.float())
    return stream.state_dict()


@pytest.mark.parametrize("announced", ["before_iter", "after_iter", "through_sampler"])
def test_announcing_the_next_epoch_closes_an_epoch_restored_at_its_end(announced):
    """Lightning (``loader.sampler.set_epoch`` after its ``iter()``) and the Hugging Face Trainer
    (``loader.set_epoch`` before it) start epoch 2 after a checkpoint at epoch 1's last batch: the
    restored epoch is closed and the run trains the uninterrupted run's epochs 2 to 4 (without
    the announcement, the first iteration would be epoch 1's empty rest: an epoch lost)."""
    expected = train(ExactLengthLoader(epoch_loader(), epochs=5), 5)
    resumed = ExactLengthLoader(epoch_loader(), epochs=5)
    resumed.load_state_dict(after_last_batch_of_epoch(1))
    if announced == "before_iter":
        resumed.set_epoch(2)
        assert len(resumed) == resumed.steps_per_epoch
    it = iter(resumed)
    if announced == "after_iter":
        resumed.set_epoch(2)
    elif announced == "through_sampler":
        resumed.sampler.set_epoch(2)
    first = []
    for x, i in it:
        resumed.loader.weighted_loss(F.mse_loss(x, torch.zeros_like(x), reduction="none").mean(1) + i.float())
        first.append(i.tolist())
    assert [first, *train(resumed, 2)] == expected[2:]
    assert resumed.epochs_started == 5


def test_announcing_the_restored_epoch_or_a_state_without_epoch_counts_keeps_its_empty_rest():
    expected = train(ExactLengthLoader(epoch_loader(), epochs=5), 5)
    state = after_last_batch_of_epoch(1)
    resumed = ExactLengthLoader(epoch_loader(), epochs=5)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the loop resumes "the epoch it was in"
    assert train(resumed, 4) == [[], *expected[2:]]
    from neuron_sift.shared.checkpoints import CHECKSUM, content_checksum

    version_1 = {k: v for k, v in state.items() if k != "epochs_started"}
    version_1["version"] = 1
    version_1[CHECKSUM] = content_checksum(version_1)  # as 0.8.0 wrote it: no count of its consumer's epochs
    old = ExactLengthLoader(epoch_loader(), epochs=5)
    old.load_state_dict(version_1)
    old.set_epoch(2)  # cannot tell the next epoch from the restored one: nothing changes
    assert old.epochs_started is None and train(old, 4) == [[], *expected[2:]]
    with pytest.raises(ValueError, match="set_epoch's epoch must be an int"):
        old.set_epoch("2")


@pytest.mark.parametrize("epochs", [3, 10])
def test_epochs_other_than_the_loaders_num_epochs_are_refused(epochs):
    """ExactLengthLoader(epochs=10) around a loader planned for 5 epochs would have trained five
    more epochs on all data; fewer would cut the plan before its annealing epochs."""
    with pytest.raises(
        ValueError, match=rf"epochs={epochs}\) around an EpochSiftingDataloader planned for num_epochs=5"
    ):
        ExactLengthLoader(epoch_loader(epochs=5), epochs=epochs)
    ExactLengthLoader(epoch_loader(epochs=5), 4, epochs=epochs)  # an explicit length does not use epochs
