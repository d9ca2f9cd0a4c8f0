"""The library's exceptions.

smart_sifting never documented the module of its exceptions, so they live here and are
re-exported from ``neuron_sift`` itself. Each one also subclasses the built-in a user
would naturally catch (``ValueError`` / ``TypeError``).
"""


class SiftConfigValidationException(ValueError):
    """A sifting config has a missing, unknown, mistyped or out-of-range field."""


class UnsupportedDataFormatException(TypeError):
    """A batch cannot be split into samples by the default handling (or by the transform)."""


class LossImplementationNotProvidedException(TypeError):
    """``loss_impl`` is missing or has no callable ``loss(model, transformed_batch, original_batch)``."""


class LossOutputException(ValueError):
    """The loss did not return one finite-or-not floating value per sample on the model's device."""
