"""How many batches the loader emits: counted ahead from the source loader's sampler.

A learning-rate schedule or a trainer sized from ``len(loader)`` needs the count before
the epoch runs. In ``fixed`` mode every source batch keeps a known number of samples, so
the count is exact; in ``probabilistic`` mode the expected kept share gives the expected
count. Kept here, apart from the loader's iteration, because the count is pure arithmetic
on the loader's configuration and its carried-over state. (Which samples an epoch trains is
the epoch mode's planner, ``neuron_sift.epoch``; here only batches are counted.)
"""

from typing import Any

from neuron_sift.dataloader.parts import SiftingParts
from neuron_sift.shared.sources import sampler_info
from neuron_sift.shared.validation import positive_int
from neuron_sift.sift_config.sift_configs import RelativeProbabilisticSiftConfig


def check_yields_a_batch(loader: Any) -> None:
    """Refuse a source that yields no batch per epoch: with ``drop_last`` a sampler shorter
    than one batch leaves its only, short batch out, and the loop would run zero steps
    without a word. A source whose length is unknown is not checked."""
    info = sampler_info(loader)
    if info is not None and info[2] and info[1] < info[0]:
        raise ValueError(
            f"SiftingDataloader: the source DataLoader's sampler yields {info[1]} samples per epoch on this rank, "
            f"fewer than one batch of {info[0]}, and it has drop_last=True, which leaves a short batch out: every "
            f"epoch would yield no batch and train nothing. Use drop_last=False, a batch size of at most "
            f"{max(info[1], 1)}, or more samples"
        )


def source_batch_sizes(loader: Any, batch_size: int | None) -> list[int]:
    """Sizes of the source batches of one epoch, from the source loader's sampler."""
    try:
        n_batches = len(loader)
    except TypeError as exc:
        raise TypeError("the source loader has no length, so the sifted length cannot be planned") from exc
    info = sampler_info(loader)
    if batch_size is None or info is None:
        raise TypeError("the length can be planned only for a torch DataLoader with a batch size and a sized sampler")
    _, n_samples, drop_last = info
    if n_batches == 0:
        return []
    last = batch_size if drop_last else n_samples - (n_batches - 1) * batch_size
    return [batch_size] * (n_batches - 1) + [last]


def plan_epochs(
    config: RelativeProbabilisticSiftConfig,
    sizes: list[int],
    batch_size: int | None,
    delay_progress: int,
    pending: int,
    epochs: int,
    resume_at: int = 0,
) -> tuple[list[int], int]:
    """Batches each of the next ``epochs`` epochs emits, and the source samples they score.

    ``sizes``: the source batches of one epoch (``source_batch_sizes``); ``delay_progress``:
    delayed source batches already passed; ``pending``: kept samples pending now.
    ``resume_at``: the first planned epoch is a resumed one whose first ``resume_at``
    source batches were consumed before the checkpoint; its count is then what is left of
    it (the delay is not restarted, the checkpoint's pending samples count).
    """
    positive_int(epochs, "epochs")
    if not sizes:
        return [0] * epochs, 0
    assert batch_size is not None  # source_batch_sizes needs it
    b = batch_size
    base = config.base_config
    expected = not config.keeps_exact_count
    share = config.expected_kept_share()
    remaining = float(pending)
    plan: list[int] = []
    scored = 0
    for epoch in range(epochs):
        skip = resume_at if epoch == 0 else 0
        if base.repeat_delay_per_epoch and skip == 0:
            delay_progress = 0
        batches = 0
        if skip:  # ready batches the checkpoint had not handed out yet are emitted first
            batches += int(remaining // b)
            remaining -= int(remaining // b) * b
        for n in sizes[skip:]:
            if delay_progress < base.sift_delay:
                delay_progress += 1
                batches += 1
                continue
            scored += n
            remaining += n * share if expected else config.fixed_keep_count(n)
            full = int(remaining // b)
            batches += full
            remaining -= full * b
        plan.append(batches)
    return plan, scored


def plan_loader(sl: SiftingParts, source: Any, epochs: int, resume_at: int) -> tuple[list[int], int]:
    """``plan_epochs`` of the loader ``sl``, whose source DataLoader (its wrappers taken off)
    is ``source``: from its configuration, delay progress and pending samples now.

    Raises:
        TypeError: the source loader has no length (or no batch size or sized sampler).
        SiftConfigValidationException: fixed mode would keep no sample of a full batch.
    """
    b = sl.batch_size
    sizes = source_batch_sizes(source, b)
    if sl.sift_config.keeps_exact_count and sizes:
        assert b is not None  # source_batch_sizes raises TypeError without one
        sl.sifter.fixed_keep_count(b)  # raises if a full batch would keep nothing
    pending = len(sl.pending) if sl.pending is not None else 0
    return plan_epochs(sl.sift_config, sizes, b, sl.delay.progress, pending, epochs, resume_at)


def exact_pass_length(sl: SiftingParts, source: Any, skip: int) -> int | None:
    """The batches the loader ``sl``'s next pass emits (what is left of it after ``skip``
    consumed source batches), when known exactly in advance: fixed or topk mode over a sized source;
    else None. A resumed pass counts what is left of it, so that its look-ahead scores the
    trailing source batches at the same point as the uninterrupted run."""
    if not sl.sift_config.keeps_exact_count or sl.batch_size is None:
        return None
    try:
        return plan_loader(sl, source, 1, skip)[0][0]
    except TypeError:
        return None
