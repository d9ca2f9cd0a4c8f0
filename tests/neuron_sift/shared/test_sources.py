"""The one unwrapping rule (``neuron_sift.shared.sources.unwrap``), against the real
wrappers: torch-xla's ``MpDeviceLoader``, accelerate's ``MpDeviceLoaderWrapper`` (what
``accelerator.prepare`` returns wherever torch-xla is installed) and ``DataLoaderShard``
(which claims to be a ``DataLoader`` through a ``__class__`` property); and the one reading
of how a DataLoader batches (``batch_settings``), with a batch size or a batch sampler."""

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from neuron_sift import EpochSiftingDataloader, SiftingDataloader
from neuron_sift.epoch.user_data.source_loader import inspect_source
from neuron_sift.shared.sources import sampler_info, underlying_dataloader, unwrap


def dataset(n=20):
    return TensorDataset(torch.arange(float(n)))


def shard(ds, batch_size=4, drop_last=False):
    """accelerate's per-process loader as ``prepare`` builds it: a batch sampler, no batch size."""
    accelerate_loaders = pytest.importorskip("accelerate.data_loader")
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(3))
    return accelerate_loaders.DataLoaderShard(ds, batch_sampler=BatchSampler(sampler, batch_size, drop_last))


class Holder:
    """A wrapper of the user's own, holding the next loader as ``._loader``."""

    def __init__(self, inner):
        self._loader = inner

    def __iter__(self):
        return iter(self._loader)

    def __len__(self):
        return len(self._loader)


def test_a_plain_dataloader_is_its_own_inside():
    dl = DataLoader(dataset(), batch_size=4)
    chain = unwrap(dl)
    assert chain.inner is dl and chain.wrappers == () and chain.reaches_dataloader
    assert underlying_dataloader(dl) is dl and chain.describe() == "DataLoader"


def test_the_accelerate_shard_is_a_wrapper_around_its_base_dataloader():
    sh = shard(dataset())
    assert isinstance(sh, DataLoader) and type(sh) is not DataLoader  # what the walk must see through
    chain = unwrap(sh)
    assert chain.wrappers == ((sh, "base_dataloader"),)
    assert type(chain.inner) is DataLoader and chain.inner is sh.base_dataloader
    assert sampler_info(underlying_dataloader(sh)) == (4, 20, False)


@pytest.mark.xla
def test_torch_xla_and_accelerate_device_loaders():
    import torch_xla
    from accelerate.data_loader import MpDeviceLoaderWrapper
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    dl = DataLoader(dataset(), batch_size=4)
    mp = MpDeviceLoader(dl, torch_xla.device())
    assert unwrap(mp).wrappers == ((mp, "_loader"),) and unwrap(mp).inner is dl
    sh = shard(dataset(), batch_size=5, drop_last=True)
    wrapped = MpDeviceLoaderWrapper(sh, torch_xla.device())
    assert wrapped.batch_sampler is not None  # where the old rule stopped, short of any DataLoader
    chain = unwrap(wrapped)
    assert [(type(w).__name__, a) for w, a in chain.wrappers] == [
        ("MpDeviceLoaderWrapper", "_loader"),
        ("DataLoaderShard", "base_dataloader"),
    ]
    assert chain.inner is sh.base_dataloader
    assert chain.describe() == "MpDeviceLoaderWrapper._loader -> DataLoaderShard.base_dataloader -> DataLoader"
    assert underlying_dataloader(wrapped) is sh.base_dataloader  # the old rule stopped at the wrapper itself
    assert sampler_info(underlying_dataloader(wrapped)) == (5, 20, True)
    info = inspect_source(wrapped)
    assert (info.n, info.batch_size, info.drop_last) == (20, 5, True) and info.dataloader is sh.base_dataloader


@pytest.mark.xla
def test_the_epoch_loader_rebuilds_the_accelerate_chain_on_the_device():
    import torch_xla
    from accelerate.data_loader import DataLoaderShard, MpDeviceLoaderWrapper

    sh = shard(dataset())
    wrapped = MpDeviceLoaderWrapper(sh, torch_xla.device())
    loader = EpochSiftingDataloader(
        {"seed": 0, "kept_share": 0.5, "start_rank_correlation": None}, wrapped, num_epochs=2
    )
    rebuilt = unwrap(loader._loader)
    assert [type(w) for w, _ in rebuilt.wrappers] == [MpDeviceLoaderWrapper, DataLoaderShard]
    assert all(mine is not theirs for (mine, _), (theirs, _) in zip(rebuilt.wrappers, unwrap(wrapped).wrappers))
    assert wrapped._loader is sh and type(sh.base_dataloader.batch_sampler) is BatchSampler  # the user's untouched
    seen = []
    for _ in range(2):
        for (x,) in loader:
            assert x.device.type == "xla"  # the copied MpDeviceLoaderWrapper still moves the batches
            seen.append(sorted(int(v) for v in x.cpu()))
            loader.weighted_loss(x.float())
    assert sorted(v for b in seen[:5] for v in b) == list(range(20))  # the warm-up epoch: every sample once
    assert len(seen) == 5 + 3 and loader.metrics()["unpaired_batches"] == 0


def test_the_epoch_loader_rebuilds_a_users_wrapper_around_the_shard():
    sh = shard(dataset())
    outer = Holder(sh)
    loader = EpochSiftingDataloader({"seed": 0, "kept_share": 0.5, "start_rank_correlation": None}, outer, num_epochs=2)
    rebuilt = unwrap(loader._loader)
    assert [type(w).__name__ for w, _ in rebuilt.wrappers] == ["Holder", "DataLoaderShard"]
    assert rebuilt.wrappers[0][0] is not outer and outer._loader is sh
    batches = [x for (x,) in loader]
    assert sorted(int(v) for b in batches for v in b) == list(range(20))
    for b in batches:
        loader.weighted_loss(b.float())


class Looped:
    def __init__(self):
        self._loader = self


def test_a_wrapper_holding_itself_is_refused():
    with pytest.raises(TypeError, match="nests more than 8 loader wrappers"):
        unwrap(Looped())


class OwnLoader:
    """A loader class of the user's own: a batch size, no DataLoader inside."""

    batch_size = 3

    def __iter__(self):
        return iter([torch.zeros(3, 2)] * 4)

    def __len__(self):
        return 4


def test_no_dataloader_inside():
    own = OwnLoader()
    outer = Holder(Holder(own))
    chain = unwrap(outer)
    assert not chain.reaches_dataloader and chain.inner is own
    assert underlying_dataloader(outer) is own  # read where a batch size is reported, as before
    with pytest.raises(TypeError, match=r"got Holder\._loader -> Holder\._loader -> OwnLoader, with no DataLoader"):
        EpochSiftingDataloader({}, outer)
    with pytest.raises(
        TypeError, match="or wrappers around one, each holding the next as ._loader or .base_dataloader"
    ):
        EpochSiftingDataloader({}, [1, 2])


def test_the_per_batch_loader_reads_the_batch_size_through_the_shard():
    from neuron_sift import RelativeProbabilisticSiftConfig
    from neuron_sift.loss.abstract_sift_loss_module import Loss

    class Score(Loss):
        def loss(self, model, transformed_batch, original_batch=None):
            return transformed_batch[0].float()

    cfg = RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=8, selection_mode="fixed", seed=0)
    outer = Holder(shard(dataset()))
    sl = SiftingDataloader(sift_config=cfg, orig_dataloader=outer, loss_impl=Score(), model=torch.nn.Identity())
    assert sl.batch_size == 4 and len(sl) > 0


# --- batch_settings: the one reading of how a DataLoader batches ---------------------------


def test_batch_settings_of_a_dataloader_with_a_batch_size():
    from torch.utils.data import SequentialSampler

    from neuron_sift.shared.sources import BatchSettings, batch_settings

    dl = DataLoader(dataset(), batch_size=4, drop_last=True)
    assert batch_settings(dl) == BatchSettings(4, True, dl.sampler, None)
    assert isinstance(dl.sampler, SequentialSampler)
    assert sampler_info(dl) == (4, 20, True)


def test_batch_settings_of_a_dataloader_built_with_a_batch_sampler():
    from neuron_sift.shared.sources import batch_settings

    sampler = RandomSampler(dataset())
    bs = BatchSampler(sampler, 6, drop_last=False)
    dl = DataLoader(dataset(), batch_sampler=bs)
    assert dl.batch_size is None  # the loader itself does not say
    settings = batch_settings(dl)
    assert (settings.batch_size, settings.drop_last, settings.sampler, settings.batch_sampler) == (
        6,
        False,
        sampler,
        bs,
    )
    assert sampler_info(dl) == (6, 20, False)


def test_batch_settings_without_automatic_batching_or_with_a_bool():
    from types import SimpleNamespace

    from neuron_sift.shared.sources import BatchSettings, batch_settings

    assert batch_settings(DataLoader(dataset(), batch_size=None)) == BatchSettings(None, False, None, None)
    odd = SimpleNamespace(batch_size=True, batch_sampler=SimpleNamespace(batch_size=False, drop_last=1, sampler=None))
    assert batch_settings(odd).batch_size is None and batch_settings(odd).drop_last is True
    assert sampler_info(odd) is None


def test_batch_settings_of_accelerates_shard():
    from neuron_sift.shared.sources import batch_settings

    sh = shard(dataset(), batch_size=5, drop_last=True)
    settings = batch_settings(sh)  # the adapter passes the base DataLoader's attributes through
    assert (settings.batch_size, settings.drop_last) == (5, True)
    assert settings.batch_sampler is sh.base_dataloader.batch_sampler
    assert settings.sampler is sh.base_dataloader.batch_sampler.sampler
    assert batch_settings(underlying_dataloader(sh)) == settings
