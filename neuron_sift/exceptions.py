"""The library's exceptions.

smart_sifting never documented the module of its exceptions, so they live here and are
re-exported from ``neuron_sift`` itself. Each one also subclasses the built-in a user
would naturally catch (``ValueError`` / ``TypeError``).
"""

import logging

_logger = logging.getLogger("neuron_sift")


class SiftConfigValidationException(ValueError):
    """A sifting config has a missing, unknown, mistyped or out-of-range field.

    Raised when a config is built (or a dict is turned into one) and, for what only the data
    can tell, at the first batch (a fixed-mode config that would keep no sample of a batch).
    The message names the config and the key, so a dict config can be fixed without reading
    the source. A ``ValueError``, so generic validation handlers catch it too.
    """


class UnsupportedDataFormatException(TypeError):
    """A batch cannot be split into samples by the default handling (or by the transform).

    Raised at the first batch whose structure the default handling cannot read (its
    messages are listed in the docs' Batches page, each with its fix: usually passing
    ``batch_transforms`` or ``batch_format_index``), and by ``ListBatch``/``TensorBatch`` for
    inconsistent inputs. A ``TypeError``: the batch's type, not its values, is the problem.
    """


class LossImplementationNotProvidedException(TypeError):
    """``loss_impl`` is missing or has no callable ``loss(model, transformed_batch, original_batch)``.

    Raised when the loader is built, not at the first batch, so a wrong argument (a class
    instead of an instance, a criterion stored as ``self.loss``) fails before any data is
    loaded; the message says which of these it is.
    """


class LossOutputException(ValueError):
    """The loss did not return one finite-or-not floating value per sample on the model's device.

    Raised when the loss returns something the selection cannot rank: not a tensor, not one
    value per sample (a mean, per-token losses), not floating point, or on another device
    than the model. Non-finite values are allowed (they are kept and counted). A
    ``ValueError``.
    """


def add_context(exc: BaseException, note: str) -> None:
    """Attach ``note`` to a user's exception that is about to be re-raised unchanged.

    The exception keeps its own type and traceback; only the note is added. Python 3.11+
    prints notes under the traceback (``BaseException.add_note``). Python 3.10 has no
    notes: the note is stored the same way (``exc.__notes__``, so code that inspects notes
    works on every version) and, since 3.10's traceback would not print it, also logged at
    ERROR on the ``neuron_sift`` logger, which Python's last-resort handler prints to
    stderr when no logging is configured.
    """
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        try:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__ and no __dict__
            notes = None
    if notes is not None:
        notes.append(note)
    _logger.error("%s: %s (%s)", type(exc).__name__, exc, note)
