"""The policy registry (``neuron_sift.epoch.selection.policies``): every name the config admits
has an entry built from the config, both score tables plan through it, and a rule added as an
entry (and its name in the config) plans without any other change."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from neuron_sift import EpochSiftConfig, EpochSiftingDataloader
from neuron_sift.epoch.planning import rank_settings
from neuron_sift.epoch.selection import policies
from neuron_sift.epoch.selection.policies import POLICY_REGISTRY, BelowMean, Percentile, epoch_policy, policy_named
from neuron_sift.sift_config import epoch_config
from tests.neuron_sift.epoch.helpers import IdDataset, oracle_loss


def test_every_policy_the_config_admits_has_one_entry_built_from_the_config():
    assert tuple(POLICY_REGISTRY) == epoch_config.EPOCH_POLICIES
    assert epoch_policy(EpochSiftConfig(beta_value=2.0, min_keep_probability=0.1)) == Percentile(2.0, 0.1)
    assert epoch_policy(EpochSiftConfig(policy="below_mean", prune_ratio=0.3)) == BelowMean(0.3)
    assert Percentile(1.0, 0.05).expected_share() == pytest.approx(EpochSiftConfig().expected_kept_share())
    with pytest.raises(ValueError, match="unknown policy 'topk'; registered: percentile, below_mean"):
        policy_named("topk")


class Half:
    """A rule of a test's own: every scored sample kept with probability one half."""

    def priorities(self, scores, summary=None):
        return np.where(np.isnan(scores), 1.0, 0.5).astype(np.float32)

    def expected_share(self):
        return 0.5


@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_a_rule_added_as_an_entry_plans_under_both_tables(monkeypatch, table):
    monkeypatch.setitem(POLICY_REGISTRY, "half", lambda config: Half())
    names = (*epoch_config.EPOCH_POLICIES, "half")
    monkeypatch.setattr(epoch_config, "EPOCH_POLICIES", names)  # the config's list of names
    monkeypatch.setitem(rank_settings._CHOICES, "policy", names)
    assert policies.epoch_policy(EpochSiftConfig(policy="half")).expected_share() == 0.5
    dl = DataLoader(IdDataset(64), batch_size=8, shuffle=True)
    config = {"policy": "half", "seed": 1, "score_table": table, "start_rank_correlation": None}
    loader = EpochSiftingDataloader(config, dl, num_epochs=4)
    assert len(loader) == 8 and loader.planned_steps() == 8 + 4 + 4 + 4  # the entry's expected share
    for _ in range(2):
        for x, _y in loader:
            loader.weighted_loss(oracle_loss(x))
    plan = loader.plan
    assert plan.kind == "sift" and plan.kept == 32  # half of every scored sample, each weighted 1 / 0.5
    kept = plan.order.numpy().astype(np.int64)
    assert torch.all(loader.tables.weights[torch.from_numpy(loader.planner.slots(kept))] == 2.0)
