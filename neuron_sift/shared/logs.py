"""The package's logger names and seed masking, defined once.

Why fixed names: smart_sifting scripts filter on the per-batch loader's logger by name,
and every part of one loader logs through its loader's logger so one filter catches all.
"""

#: The per-batch loader's logger (smart_sifting's documented ``...dataloader.sift_dataloader`` lines).
LOADER_LOGGER = "neuron_sift.dataloader.sift_dataloader"
#: The epoch-level loader's logger; every part of the epoch mode logs through it.
EPOCH_LOGGER = "neuron_sift.epoch.loader"

MASK63 = (1 << 63) - 1


def seed63(value: int) -> int:
    """``value`` as a non-negative int64 seed (any Python int, negative ones included)."""
    return int(value) & MASK63
