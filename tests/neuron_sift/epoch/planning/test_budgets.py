"""The automatic budget (``EpochSiftConfig.max_pruned_share``): a sifted epoch with ``p``
sifted epochs left keeps ``1 - max_pruned_share * p / (p + 1)``, exactly; a short run prunes
less than a long one; the budget is part of the run a checkpoint must agree on."""

import pytest
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader
from neuron_sift.exceptions import SiftConfigValidationException
from tests.neuron_sift.epoch.helpers import PRUNE_FROM_THE_START, IdDataset, oracle_loss


def loader(epochs, **cfg):
    dl = DataLoader(IdDataset(100), batch_size=10, shuffle=True)
    config = {"seed": 1, "max_pruned_share": 0.6, "anneal_fraction": 0.0, **PRUNE_FROM_THE_START, **cfg}
    return EpochSiftingDataloader(config, dl, num_epochs=epochs)


def test_each_sifted_epoch_keeps_one_minus_the_share_times_p_over_p_plus_one():
    config = EpochSiftConfig(max_pruned_share=0.6)
    assert [config.budget_share(p) for p in (1, 2, 5)] == pytest.approx([0.7, 0.6, 0.5])
    assert config.budget_share(None) == pytest.approx(0.4)  # no planned end: a long run's limit
    assert EpochSiftConfig(kept_share=0.3).budget_share(1) == 0.3 and EpochSiftConfig().budget_share(1) is None
    short, long = loader(4), loader(10)
    assert [short.planner.budget_count(e) for e in (1, 2, 3)] == [55, 60, 70]  # p = 3, 2, 1
    assert [long.planner.budget_count(e) for e in (1, 5, 9)] == [46, 50, 70]  # p = 9, 5, 1
    assert short.length_is_exact and short.planned_steps() == 10 + 6 + 6 + 7


def test_the_plans_keep_the_budgeted_counts():
    run = loader(4)
    for _ in range(4):
        for x, _y in run:
            run.weighted_loss(oracle_loss(x))
    assert [h["kept"] for h in run.history] == [100, 55, 60, 70]


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"max_pruned_share": 0.5, "kept_share": 0.5}, "give it or kept_share, not both"),
        ({"max_pruned_share": 1.0}, "max_pruned_share"),
        ({"max_pruned_share": 0.0}, "max_pruned_share"),
    ],
)
def test_a_budget_set_twice_or_out_of_range_is_refused(cfg, message):
    with pytest.raises(SiftConfigValidationException, match=message):
        EpochSiftConfig(**cfg)


def test_a_checkpoint_of_another_automatic_budget_is_refused():
    first = loader(4)
    for x, _y in first:
        first.weighted_loss(oracle_loss(x))
    with pytest.raises(ValueError, match="checkpoint has max_pruned_share=0.6 but this loader has 0.5"):
        loader(4, max_pruned_share=0.5).load_state_dict(first.state_dict())
