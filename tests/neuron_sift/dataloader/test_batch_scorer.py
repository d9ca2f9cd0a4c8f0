"""What the per-batch loader scores with: a scoring model of the user's (trained on the
batches it yields when given an optimizer), excess loss over a reference table read by
sample id, the reference alone (no forward), and every refusal of a setup that would
score otherwise than asked."""

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from neuron_sift import Loss, ReferenceTable, RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.neuron_sift.dataloader.fakes import OracleLoss, loss_table_loader, tiny_model


def config(criterion="loss", mode="topk", beta=1.0, delay=0):
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": delay}},
        selection_mode=mode,
        seed=0,
        criterion=criterion,
    )


def kept_ids(loader):
    out = [int(i) for ids, _ in loader for i in ids]
    batch = loader.pending_batch()
    return sorted(out + ([] if batch is None else batch.to_user()[0].tolist()))


def top_half(scores, batch_size):
    """The ids topk mode keeps at beta 1: the higher half of each source batch's scores."""
    keep = []
    for start in range(0, scores.numel(), batch_size):
        block = scores[start : start + batch_size]
        k = int(block.numel() / 2 + 0.5)
        keep += [start + int(i) for i in torch.topk(block, k).indices]
    return sorted(keep)


def test_excess_loss_ranks_the_loss_minus_the_reference():
    g = torch.Generator().manual_seed(0)
    losses, reference = torch.rand(256, generator=g), torch.rand(256, generator=g)
    loader = SiftingDataloader(
        config("excess"),
        loss_table_loader(losses, 32),
        loss_impl=OracleLoss(),
        model=tiny_model(),
        reference=ReferenceTable.from_losses(reference),
    )
    assert kept_ids(loader) == top_half(losses - reference, 32)
    assert kept_ids(loader) != top_half(losses, 32)  # the reference changed the choice


def test_excess_loss_follows_a_shuffled_sampler():
    """The ids come from the sampler: a shuffled order pairs each loss with its own reference."""
    g = torch.Generator().manual_seed(1)
    losses, reference = torch.rand(256, generator=g), torch.rand(256, generator=g)
    source = loss_table_loader(losses, 32, shuffle=True, generator=torch.Generator().manual_seed(5))
    loader = SiftingDataloader(
        config("excess"),
        source,
        loss_impl=OracleLoss(),
        model=tiny_model(),
        reference=ReferenceTable.from_losses(reference),
    )
    order = torch.cat([b[0] for b in loss_table_loader(losses, 32, True, torch.Generator().manual_seed(5))])
    excess = (losses - reference)[order]
    assert kept_ids(loader) == sorted(int(order[i]) for i in top_half(excess, 32))


def test_the_reference_alone_runs_no_forward_and_keeps_what_it_predicts_best():
    reference = torch.rand(128, generator=torch.Generator().manual_seed(2))
    loss = OracleLoss()
    loader = SiftingDataloader(
        config("reference"),
        loss_table_loader(torch.zeros(128), 16),
        loss_impl=loss,
        model=tiny_model(),
        reference=ReferenceTable.from_losses(reference),
    )
    assert kept_ids(loader) == top_half(-reference, 16)
    assert loss.calls == 0


def test_a_reference_table_is_read_from_its_folder(tmp_path):
    reference = torch.rand(64, generator=torch.Generator().manual_seed(3))
    ReferenceTable.from_losses(reference).save(tmp_path / "ref")
    loader = SiftingDataloader(
        config("reference"),
        loss_table_loader(torch.zeros(64), 8),
        loss_impl=OracleLoss(),
        model=tiny_model(),
        reference=str(tmp_path / "ref"),
    )
    assert kept_ids(loader) == top_half(-reference, 8)


class PairLoss(Loss):
    """Squared error of a linear model on (x, y) batches, per sample."""

    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        return ((model(x).squeeze(1) - y) ** 2).float()


def regression(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5]))


class IdScore(Loss):
    """A sample's score is the model applied to its id: a model's weight decides the order."""

    def loss(self, model, transformed_batch, original_batch=None):
        ids, _ = original_batch
        return model(ids.float()[:, None]).squeeze(1)


def linear(weight):
    model = torch.nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(weight)
        model.bias.zero_()
    return model


def test_a_scoring_model_scores_instead_of_the_model():
    ids = torch.arange(128).float()
    loss = IdScore()
    by_model = SiftingDataloader(config("loss"), loss_table_loader(ids, 16), loss_impl=loss, model=linear(1.0))
    assert kept_ids(by_model) == top_half(ids, 16)
    by_scorer = SiftingDataloader(
        config("loss"), loss_table_loader(ids, 16), loss_impl=loss, model=linear(1.0), scoring_model=linear(-1.0)
    )
    assert kept_ids(by_scorer) == top_half(-ids, 16)


def test_a_scoring_model_with_an_optimizer_learns_on_each_yielded_batch():
    data = regression(128)
    scorer = torch.nn.Linear(3, 1)
    before = scorer.weight.detach().clone()
    optimizer = torch.optim.SGD(scorer.parameters(), lr=0.05)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    loader = SiftingDataloader(
        config("loss"),
        DataLoader(data, batch_size=16),
        loss_impl=PairLoss(),
        model=torch.nn.Linear(3, 1),
        scoring_model=scorer,
        scoring_optimizer=optimizer,
    )
    yielded = sum(1 for _ in loader)
    assert yielded == len(steps) == 4  # one step of its own per yielded batch
    assert not torch.equal(scorer.weight, before) and scorer.training  # its mode is restored
    timings = loader.metrics()["timings"]
    assert timings["train_scorer"]["calls"] == 4
    assert loader.machinery_seconds < sum(v["seconds"] for v in timings.values())  # counted as the scorer's cost


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"criterion": "excess"}, ValueError, "needs a reference table"),
        ({"reference": True}, ValueError, "does not read it"),
        ({"scoring_optimizer": True}, ValueError, "give scoring_model too"),
        ({"scoring_model": "model"}, TypeError, "scoring_model must be a torch.nn.Module"),
        ({"criterion": "reference", "reference": True, "scoring_model": True}, ValueError, "not used with"),
        ({"reference": 3, "criterion": "excess"}, TypeError, "reference must be a ReferenceTable"),
    ],
)
def test_a_setup_that_would_score_otherwise_is_refused(kwargs, error, match):
    criterion = kwargs.pop("criterion", "loss")
    model = torch.nn.Linear(3, 1)
    if kwargs.get("reference") is True:
        kwargs["reference"] = ReferenceTable.from_losses(torch.zeros(64))
    if kwargs.get("scoring_model") is True:
        kwargs["scoring_model"] = torch.nn.Linear(3, 1)
    if kwargs.get("scoring_optimizer") is True:
        kwargs["scoring_optimizer"] = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(error, match=match):
        SiftingDataloader(
            config(criterion), DataLoader(regression(), batch_size=16), loss_impl=PairLoss(), model=model, **kwargs
        )


def test_a_reference_of_another_dataset_is_refused():
    with pytest.raises(ValueError, match="65"):
        SiftingDataloader(
            config("excess"),
            loss_table_loader(torch.zeros(64), 8),
            loss_impl=OracleLoss(),
            model=tiny_model(),
            reference=ReferenceTable.from_losses(torch.zeros(65)),
        )


def test_a_reference_that_does_not_cover_a_sample_is_refused_naming_it():
    reference = torch.zeros(64)
    reference[37] = float("nan")  # not covered
    loader = SiftingDataloader(
        config("excess"),
        loss_table_loader(torch.zeros(64), 8),
        loss_impl=OracleLoss(),
        model=tiny_model(),
        reference=ReferenceTable.from_losses(reference),
    )
    with pytest.raises(ValueError, match="37"):
        list(loader)


class Stream(IterableDataset):
    """Samples that carry their index, read in the stream's own order."""

    def __init__(self, losses):
        self.losses = losses

    def __iter__(self):
        for i in reversed(range(self.losses.numel())):
            yield torch.tensor(i), self.losses[i]


def test_a_stream_gives_its_ids_through_sample_ids():
    g = torch.Generator().manual_seed(6)
    losses, reference = torch.rand(96, generator=g), torch.rand(96, generator=g)
    source = DataLoader(Stream(losses), batch_size=16)
    with pytest.raises(TypeError, match="sample_ids=fn"):
        SiftingDataloader(
            config("excess"),
            source,
            loss_impl=OracleLoss(),
            model=tiny_model(),
            reference=ReferenceTable.from_losses(reference),
        )
    loader = SiftingDataloader(
        config("excess"),
        source,
        loss_impl=OracleLoss(),
        model=tiny_model(),
        reference=ReferenceTable.from_losses(reference),
        sample_ids=lambda batch: batch[0],
    )
    order = torch.arange(95, -1, -1)
    assert kept_ids(loader) == sorted(int(order[i]) for i in top_half((losses - reference)[order], 16))


def test_sample_ids_of_another_length_than_the_batch_are_refused():
    loader = SiftingDataloader(
        config("excess"),
        loss_table_loader(torch.zeros(64), 8),
        loss_impl=OracleLoss(),
        model=tiny_model(),
        reference=ReferenceTable.from_losses(torch.zeros(64)),
        sample_ids=lambda batch: batch[0][:4],
    )
    with pytest.raises(ValueError, match="8 samples came with 4 sample ids"):
        list(loader)


def test_a_scoring_model_on_another_device_is_refused():
    scorer = torch.nn.Linear(1, 1, device="meta")
    with pytest.raises(ValueError, match="scoring_model is on meta but the model is on cpu"):
        SiftingDataloader(
            config("loss"),
            loss_table_loader(torch.zeros(64), 8),
            loss_impl=IdScore(),
            model=linear(1.0),
            scoring_model=scorer,
        )


def test_ids_stay_paired_through_workers_a_peek_and_a_mid_pass_resume():
    """A user's own sampler, a DataLoader worker prefetching, a peek with
    ``next(iter(loader))`` (its prefetched indices never come), then a pass broken off,
    checkpointed and resumed in a new loader: every kept sample is one of the lower-reference
    half of its own source batch (the ids a prefetch or a stale pass left behind would pair
    a batch with another batch's references)."""
    n, b = 320, 16
    g = torch.Generator().manual_seed(4)
    losses, reference = torch.rand(n, generator=g), torch.rand(n, generator=g)
    order = torch.randperm(n, generator=g).tolist()
    keep = set()
    for start in range(0, n, b):
        block = order[start : start + b]
        keep |= set(sorted(block, key=lambda i: float(reference[i]))[: b // 2])

    def make():
        from tests.neuron_sift.dataloader.fakes import LossTableDataset

        source = DataLoader(LossTableDataset(losses), batch_size=b, sampler=order, num_workers=1)
        return SiftingDataloader(
            config("reference"),
            source,
            loss_impl=OracleLoss(),
            model=tiny_model(),
            reference=ReferenceTable.from_losses(reference),
        )

    loader = make()
    seen = [int(i) for i in next(iter(loader))[0]]  # a peek
    it = iter(loader)
    for _ in range(4):
        seen += [int(i) for i in next(it)[0]]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    seen += [int(i) for ids, _ in resumed for i in ids]
    assert seen and set(seen) <= keep


def test_an_abandoned_pass_still_prefetching_records_into_its_own_queue():
    """A prefetching thread (torch-xla's MpDeviceLoader) of an abandoned pass may pull from
    the sampler after the next pass began: its indices must not reach the next pass's queue."""
    from torch.utils.data import BatchSampler, SequentialSampler

    from neuron_sift.dataloader.sample_ids import RecordingBatchSampler

    sampler = RecordingBatchSampler(BatchSampler(SequentialSampler(range(40)), 4, False))
    old = iter(sampler)
    next(old)
    new = iter(sampler)
    next(new)
    next(old)  # the abandoned pass's thread pulls once more
    assert list(sampler.recorded) == [[0, 1, 2, 3]]  # the new pass's one batch only


def test_sample_ids_without_a_reference_are_refused():
    with pytest.raises(ValueError, match="sample_ids= gives the ids a reference table is read by"):
        SiftingDataloader(
            config(),
            loss_table_loader(torch.rand(64), 16),
            loss_impl=OracleLoss(),
            model=tiny_model(),
            sample_ids=lambda b: b[0],
        )


def test_a_checkpoint_resumes_only_under_the_criterion_it_ranked_by():
    """The loss history holds values of the checkpoint's criterion: another one's scale would
    be ranked against it."""
    losses = torch.rand(128)
    raw = SiftingDataloader(config(), loss_table_loader(losses, 16), loss_impl=OracleLoss(), model=tiny_model())
    next(iter(raw))
    excess = SiftingDataloader(
        config("excess"),
        loss_table_loader(losses, 16),
        loss_impl=OracleLoss(),
        model=tiny_model(),
        reference=ReferenceTable.from_losses(torch.rand(128)),
    )
    with pytest.raises(ValueError, match="criterion='loss', this loader's config by 'excess'"):
        excess.load_state_dict(raw.state_dict())
