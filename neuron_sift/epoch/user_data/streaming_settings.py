"""MosaicML Streaming's own iteration settings that the epoch mode cannot honour, refused by name.

Why: ``StreamingDataset`` shuffles, resamples and partitions its samples over ranks and
workers in its own ``__iter__``. The epoch mode never iterates it: it reads samples by index
through ``IndexedView`` (``user_data/source_loader.py``), and its plans decide each epoch's samples, their
order and every rank's share. A setting that only shapes that iteration would be ignored
without a word, so each one set away from what the epoch mode does is refused, naming the
setting and what to set instead.

Honoured, and so accepted: ``shuffle`` (``True``: a new random order every epoch, drawn by
the plans; ``False``: dataset order), the shard cache (``cache_limit``, ``predownload``
and downloads happen in the dataset's own random access), a per-rank ``__len__`` (the plans
cover ``size``, every sample). The package is found by the class's module, not imported, and
each setting's default is read from the class's own signature, so a release that lacks a
setting or changes a default is checked by what it has.
"""

import inspect
from typing import Any

ORDER = (
    "the plans decide each epoch's order: with shuffle=True a new random order every epoch, seeded by "
    "EpochSiftConfig(seed=...) (else the DataLoader's generator), with shuffle=False dataset order"
)
SHARES = (
    "EpochSiftingDataloader plans each epoch over every sample and deals it out to the ranks of the process group "
    "itself, and resumes at another world size with load_state_dict_from_ranks"
)

# setting: (what it does in StreamingDataset's iteration, what the epoch mode does instead)
SETTINGS = {
    "shuffle_algo": ("its own shuffle algorithm", ORDER),
    "shuffle_seed": ("the seed of its own shuffle", ORDER + "; give the seed there"),
    "shuffle_block_size": ("the span of its own shuffle", ORDER),
    "num_canonical_nodes": ("how its own iteration splits the samples over nodes", SHARES),
    "partition_algo": ("how its own iteration splits the samples over ranks and workers", SHARES),
    "batching_method": ("how its own iteration composes batches from the streams", "the plans batch the kept samples"),
    "replication": (
        "groups of consecutive ranks reading the same samples (tensor or sequence parallelism)",
        SHARES + ", each rank its own share (data parallelism only)",
    ),
}
SHUFFLE_ONLY = ("shuffle_algo", "shuffle_seed", "shuffle_block_size")  # without shuffle=True they change nothing
# Filled in by StreamingDataset's own __iter__ when left unset: once it has iterated, a value is its own.
DERIVED = ("num_canonical_nodes", "shuffle_block_size")


def streaming_class(ds: Any) -> type | None:
    """The ``StreamingDataset`` class ``ds`` is (or derives from), or None."""
    for cls in type(ds).__mro__:
        if cls.__name__ == "StreamingDataset" and cls.__module__.split(".")[0] == "streaming":
            return cls
    return None


def check_streaming_settings(ds: Any) -> None:
    """Refuse a ``StreamingDataset`` whose resampling or iteration settings the epoch mode
    would ignore, naming each and what to set instead; any other dataset passes."""
    cls = streaming_class(ds)
    if cls is None:
        return
    problems = _resampled_streams(ds)
    defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()}
    iterated = _count(getattr(ds, "next_epoch", 0)) > 0
    for name, (does, instead) in SETTINGS.items():
        if name not in defaults or not hasattr(ds, name):
            continue  # a release without this setting
        value, default = getattr(ds, name), defaults[name]
        if name in SHUFFLE_ONLY and not getattr(ds, "shuffle", False):
            continue
        if name in DERIVED and iterated:
            continue
        if name == "replication" and value in (None, 1):
            continue
        if value != default:
            problems.append(f"{name}={value!r} ({does}): {instead}; leave {name} at its default ({default!r})")
    if problems:
        raise ValueError(
            f"EpochSiftingDataloader reads {type(ds).__name__} by sample index and never iterates it, so these "
            "settings of its iteration would be ignored: " + "; ".join(problems)
        )


def _resampled_streams(ds: Any) -> list[str]:
    """Each stream drawn other than once per sample per epoch (``epoch_size``, a stream's
    ``proportion``, ``repeat`` or ``choose``), as a refusal."""
    streams = getattr(ds, "streams", None)
    samples = getattr(ds, "samples_per_stream", None)
    if streams is None or samples is None:
        return []
    drawn = [(i, _count(getattr(s, "choose", n)), _count(n)) for i, (s, n) in enumerate(zip(streams, samples))]
    resampled = [f"stream {i}: {c} of its {n}" for i, c, n in drawn if c != n]
    if not resampled:
        return []
    return [
        f"an epoch resampled from the streams ({', '.join(resampled)} samples per epoch; epoch_size="
        f"{getattr(ds, 'epoch_size', None)!r}): each plan trains every kept sample once per epoch; leave "
        "epoch_size unset (None) and give each Stream no proportion, repeat or choose"
    ]


def _count(value: Any) -> int:
    """A NumPy or Python integer from Streaming's metadata, as a Python int."""
    return int(value) if value is not None else 0
