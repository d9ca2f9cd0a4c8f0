"""A user's own exception reaches them unchanged, with neuron_sift's context visible, on every Python.

The context is a note (``BaseException.add_note``) on Python 3.11+; Python 3.10 has no notes,
so there it is stored as ``__notes__`` and logged. CI runs this file on 3.10 and on 3.11+.
"""

import logging
import sys
import traceback

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from neuron_sift import Loss, SiftingDataloader
from neuron_sift.data_model.data_model_interface import SiftingBatchTransform
from neuron_sift.data_model.default_batch import DefaultBatchTransform
from neuron_sift.exceptions import add_context

from .dataloader.fakes import OracleLoss, loss_table_loader, tiny_model


class Boom(Exception):
    """A user's own exception type (not a built-in the library might special-case)."""


def raise_boom(where):
    raise Boom(f"user bug in {where}")


class BoomLoss(Loss):
    def loss(self, model, transformed_batch, original_batch=None):
        raise_boom("the loss")


class BoomTransform(SiftingBatchTransform):
    def transform(self, batch):
        raise_boom("the transform")

    def reverse_transform(self, sifting_batch):
        return DefaultBatchTransform().reverse_transform(sifting_batch)


class FailsAtSample(Dataset):
    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise_boom("the source loader")
        return torch.tensor(i), torch.rand(())


def config():
    return {"beta_value": 1, "loss_history_length": 64, "loss_based_sift_config": {"sift_config": {"sift_delay": 0}}}


def loader(**kwargs):
    args = dict(sift_config=config(), orig_dataloader=loss_table_loader(torch.rand(32), 8), model=tiny_model())
    args.update(kwargs)
    if "loss_impl" not in args:
        args["loss_impl"] = OracleLoss()
    return SiftingDataloader(**args)


def assert_context_visible(exc, caplog, expected):
    """The note is in ``__notes__`` and in what the user sees: the printed traceback (3.11+) or the log (3.10)."""
    assert any(expected in note for note in exc.__notes__), exc.__notes__
    if sys.version_info >= (3, 11):
        assert expected in "".join(traceback.format_exception(exc))
    else:
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(expected in m and "Boom" in m for m in errors), errors


@pytest.mark.parametrize(
    "where, make, expected",
    [
        ("the loss", lambda: loader(loss_impl=BoomLoss()), "while scoring source batch 0 of epoch 0"),
        (
            "the transform",
            lambda: loader(batch_transforms=BoomTransform()),
            "while transforming source batch 0 of epoch 0",
        ),
        (
            "the source loader",
            lambda: loader(orig_dataloader=DataLoader(FailsAtSample(32, bad=17), batch_size=8)),
            "while loading source batch 2 of epoch 0",
        ),
    ],
)
def test_user_exception_keeps_its_type_traceback_and_context(where, make, expected, caplog):
    with caplog.at_level(logging.ERROR, logger="neuron_sift"), pytest.raises(Boom) as info:
        list(make())
    exc = info.value
    assert type(exc) is Boom and str(exc) == f"user bug in {where}"
    # The traceback still reaches the user's own frame that raised it.
    assert traceback.extract_tb(exc.__traceback__)[-1].name == "raise_boom"
    assert_context_visible(exc, caplog, expected)


def test_add_context_appends_in_order_and_keeps_the_exception():
    exc = Boom("x")
    add_context(exc, "first")
    add_context(exc, "second")
    assert exc.__notes__[-2:] == ["first", "second"]
    assert exc.args == ("x",)
