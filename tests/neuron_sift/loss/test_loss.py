"""The ``Loss`` interface and how a ``loss_impl`` is resolved to a callable."""

import pytest
import torch

import neuron_sift
from neuron_sift.exceptions import LossImplementationNotProvidedException
from neuron_sift.loss.abstract_sift_loss_module import Loss, resolve_loss_fn


def _model_and_batch():
    model = torch.nn.Linear(4, 3)
    x = torch.randn(6, 4)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    return model, (x, y)


def _reference_losses(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


class DocumentedLoss(Loss):
    """The shape of the smart_sifting example: own __init__, no super().__init__()."""

    def __init__(self):
        self.loss_no_reduction = torch.nn.CrossEntropyLoss(reduction="none")

    def loss(self, model, transformed_batch, original_batch=None):
        x, y = original_batch
        return self.loss_no_reduction(model(x), y)


def test_loss_is_exported_at_the_smart_sifting_path():
    assert neuron_sift.Loss is Loss
    assert issubclass(LossImplementationNotProvidedException, TypeError)


def test_subclass_without_super_init_works():
    model, batch = _model_and_batch()
    impl = DocumentedLoss()
    fn = resolve_loss_fn(impl)
    out = fn(model, None, batch)
    assert out.shape == (6,)
    torch.testing.assert_close(out, _reference_losses(model, batch))
    # The bound method of the user's own object.
    assert fn.__self__ is impl


def test_subclass_with_positional_and_keyword_call():
    model, batch = _model_and_batch()
    fn = resolve_loss_fn(DocumentedLoss())
    torch.testing.assert_close(fn(model, batch, original_batch=batch), _reference_losses(model, batch))


def test_duck_typed_object_with_a_loss_method():
    class NotALoss:  # does not subclass Loss
        def __init__(self):
            self.calls = 0

        def loss(self, model, transformed_batch, original_batch=None):
            self.calls += 1
            x, y = original_batch
            return torch.nn.functional.cross_entropy(model(x), y, reduction="none")

    model, batch = _model_and_batch()
    impl = NotALoss()
    fn = resolve_loss_fn(impl)
    torch.testing.assert_close(fn(model, None, batch), _reference_losses(model, batch))
    assert impl.calls == 1


def test_duck_typed_object_with_a_plain_function_attribute():
    # A namespace-like object whose ``loss`` is a function (not a module): accepted.
    class Holder:
        pass

    holder = Holder()
    holder.loss = lambda model, transformed_batch, original_batch=None: _reference_losses(model, original_batch)
    model, batch = _model_and_batch()
    torch.testing.assert_close(resolve_loss_fn(holder)(model, None, batch), _reference_losses(model, batch))


def test_none_raises():
    with pytest.raises(LossImplementationNotProvidedException, match="loss_impl"):
        resolve_loss_fn(None)


@pytest.mark.parametrize("impl", [object(), 3, "loss", torch.nn.CrossEntropyLoss(reduction="none")])
def test_object_without_loss_method_raises(impl):
    with pytest.raises(LossImplementationNotProvidedException, match="loss") as info:
        resolve_loss_fn(impl)
    assert type(impl).__name__ in str(info.value)


def test_non_callable_loss_attribute_raises():
    class Broken:
        loss = 3

    with pytest.raises(LossImplementationNotProvidedException, match="Broken"):
        resolve_loss_fn(Broken())


def test_subclass_not_overriding_loss_raises_at_resolution():
    class Forgot(Loss):
        def __init__(self):
            self.criterion = torch.nn.CrossEntropyLoss(reduction="none")

    with pytest.raises(LossImplementationNotProvidedException, match="Forgot"):
        resolve_loss_fn(Forgot())
    with pytest.raises(LossImplementationNotProvidedException):
        resolve_loss_fn(Loss())


def test_base_loss_method_raises_when_called():
    model, batch = _model_and_batch()
    with pytest.raises(LossImplementationNotProvidedException, match="does not implement"):
        Loss().loss(model, batch)


def test_instance_attribute_module_shadowing_the_method_raises():
    # The pitfall of one documented snippet: ``self.loss = CrossEntropyLoss(...)`` hides ``loss``.
    class Shadowed(Loss):
        def __init__(self):
            self.loss = torch.nn.CrossEntropyLoss(reduction="none")

        def loss(self, model, transformed_batch, original_batch=None):  # noqa: F811 - hidden by the attribute
            raise AssertionError("never reached")

    with pytest.raises(LossImplementationNotProvidedException) as info:
        resolve_loss_fn(Shadowed())
    msg = str(info.value)
    assert "CrossEntropyLoss" in msg and "instance attribute" in msg

    class ShadowedDuck:  # same mistake without subclassing Loss
        def __init__(self):
            self.loss = torch.nn.MSELoss(reduction="none")

    with pytest.raises(LossImplementationNotProvidedException, match="MSELoss"):
        resolve_loss_fn(ShadowedDuck())


def test_class_instead_of_instance_raises():
    # ``loss_impl=MyLoss`` (forgot the parentheses): the method would be called unbound,
    # with the model as ``self``.
    with pytest.raises(LossImplementationNotProvidedException, match="DocumentedLoss"):
        resolve_loss_fn(DocumentedLoss)


def test_class_with_a_static_loss_is_accepted():
    # Duck typing: a class whose ``loss`` is a staticmethod is a usable loss_impl as it is.
    class StaticLoss:
        @staticmethod
        def loss(model, transformed_batch, original_batch=None):
            return _reference_losses(model, original_batch)

    model, batch = _model_and_batch()
    torch.testing.assert_close(resolve_loss_fn(StaticLoss)(model, None, batch), _reference_losses(model, batch))
