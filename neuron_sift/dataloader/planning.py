"""How many batches the loader emits: planned from the source loader's sampler.

A learning-rate schedule or a trainer sized from ``len(loader)`` needs the count before
the epoch runs. In ``fixed`` mode every source batch keeps a known number of samples, so
the count is exact; in ``probabilistic`` mode the expected kept share gives the expected
count. Kept here, apart from the loader's iteration, because the plan is pure arithmetic
on the loader's configuration and its carried-over state.
"""

from typing import Any

from neuron_sift.shared.sources import sampler_info
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
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if not sizes:
        return [0] * epochs, 0
    assert batch_size is not None  # source_batch_sizes needs it
    b = batch_size
    base = config.base_config
    expected = config.selection_mode != "fixed"
    share = 1.0 / (1.0 + config.beta_value)
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
