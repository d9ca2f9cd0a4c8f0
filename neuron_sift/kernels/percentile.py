"""Percentile of each new loss within the loss history."""

import torch

METHODS = ("search", "merge")


def check_method(method: str) -> str:
    """``method`` if it names a sort-based formulation (``METHODS``); else a ValueError."""
    if method not in METHODS:
        raise ValueError(f"method must be 'search' or 'merge', got {method!r}")
    return method


def _slots_in_use(history: torch.Tensor, fill: torch.Tensor, slots: torch.Tensor | None) -> torch.Tensor:
    """``arange(H) < fill``. Pass ``slots = arange(H)`` made once: torch-xla builds an
    ``arange`` on the host each time it is traced."""
    if slots is None:
        slots = torch.arange(history.shape[0], device=history.device)
    return slots < fill


def percentile_rank(
    losses: torch.Tensor, history: torch.Tensor, fill: torch.Tensor, slots: torch.Tensor | None = None
) -> torch.Tensor:
    """Mid-rank percentile of ``losses[i]`` among the first ``fill`` entries of ``history``.

    ``(#{h < l} + 0.5 * #{h == l}) / fill``: ties count half, so a batch of equal losses
    against an equal history sits at 0.5 rather than at 0 or 1. Only the first ``fill``
    slots are valid (the ring buffer fills from slot 0), which keeps the shape ``[H]``
    static while the history is filling. With an empty history (``fill == 0``) every
    percentile is 1.0: with nothing to compare against, nothing is judged easy.

    Non-finite losses get whatever the comparison gives; callers decide what to do with
    them (the history itself never holds a non-finite value).

    Cost is B x H comparisons; fine for the documented sizes (see benchmarks/).
    """
    valid = _slots_in_use(history, fill, slots)  # [H]
    l = losses.to(history.dtype).unsqueeze(1)  # [B, 1]
    # Slots not in use hold NaN, which compares false with everything (a NaN loss too),
    # so they never count: one select over H instead of a mask over B x H.
    hist = torch.where(valid, history, torch.full_like(history, float("nan"))).unsqueeze(0)  # [1, H]
    # #{h < l} + #{h <= l} = 2 * less + equal, in one reduction (XLA fuses it into one loop),
    # in int32 (at most 2H); (less + 0.5 * equal) is exactly half of it in float32.
    twice = (hist < l).to(torch.int32) + (hist <= l).to(torch.int32)
    twice = twice.sum(dim=1, dtype=torch.int32 if history.shape[0] < 2**30 else torch.int64)
    denom = torch.clamp(fill, min=1).to(history.dtype)
    pct = (twice.to(history.dtype) * 0.5) / denom
    return torch.where(fill > 0, pct, torch.ones_like(pct))


# Longest sort the merge formulation builds. Neuron's compiler limits TopK to k <= 16384
# (NCC_EVRF014) and may rewrite a sort followed by a slice into a TopK over the whole
# dimension (aws-neuron-sdk issue 1339), so no sorted dimension is longer than this.
MAX_SORT_LENGTH = 16384


def _history_counts_before(first: torch.Tensor, second: torch.Tensor, history_first: bool) -> torch.Tensor:
    """Per row of ``[R, n]`` inputs: for each loss, the history values sorted before it in
    ``cat([first, second], 1)``.

    A stable sort keeps equal values in concatenation order: with the history first,
    equal history values sort before the loss (counts ``h <= l``); with the losses first,
    after it (counts ``h < l``). Static shapes: sort, cumsum, an overwrite scatter, slice.
    """
    n_first = first.shape[1]
    values = torch.cat([first, second], dim=1)
    order = torch.sort(values, dim=1, stable=True).indices
    is_hist = (order < n_first) if history_first else (order >= n_first)
    is_hist = is_hist.to(torch.int64)
    before = torch.cumsum(is_hist, dim=1) - is_hist  # history values strictly before each sorted slot
    counts = torch.zeros_like(before).scatter(1, order, before)  # back to concatenation order
    return counts[:, n_first:] if history_first else counts[:, :n_first]


def _merge_counts(history: torch.Tensor, losses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(#{h < l}, #{h <= l})`` per loss by stable sorts, none longer than ``MAX_SORT_LENGTH``.

    The history is cut into equal chunks (the last padded with ``+inf``) of at most
    ``MAX_SORT_LENGTH - B`` values; each chunk is merged with the losses in one batched
    sort and the counts are summed over chunks (counts add up; the ``+inf`` padding only
    counts against an infinite loss, which the caller clamps to ``fill``).
    """
    h, b = history.shape[0], losses.shape[0]
    room = MAX_SORT_LENGTH - b
    if room < 1:
        raise ValueError(
            f"percentile_rank_sorted(method='merge') needs fewer than {MAX_SORT_LENGTH} losses per call, got {b}"
        )
    chunks = -(-h // room)
    size = -(-h // chunks)
    if chunks * size > h:
        history = torch.cat([history, history.new_full((chunks * size - h,), float("inf"))])
    hist = history.view(chunks, size)
    l = losses.unsqueeze(0).expand(chunks, b)
    not_greater = _history_counts_before(hist, l, history_first=True).sum(dim=0)
    less = _history_counts_before(l, hist, history_first=False).sum(dim=0)
    return less, not_greater


def percentile_rank_sorted(
    losses: torch.Tensor,
    history: torch.Tensor,
    fill: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    method: str = "search",
) -> torch.Tensor:
    """``percentile_rank`` by sorting instead of comparing every loss with every slot.

    Identical results, ties included (tested against ``percentile_rank``). The slots at
    or beyond ``fill`` are set to ``+inf`` and the counts are clamped to ``fill``, so the
    padding never counts, even for an infinite loss. A NaN loss gets 0, as the pairwise
    comparison gives it; ``-0.0`` is read as ``0.0`` (they compare equal).

    ``method``, chosen by the caller (the backend knows its device; a kernel never asks
    what a device is): ``"merge"`` where ``searchsorted`` has no lowering (XLA),
    ``"search"`` elsewhere:

    * ``"search"``: sort the history once, then ``searchsorted`` left (``#{h < l}``) and
      right (``#{h <= l}``); O(H log H + B log H). Fastest eagerly, but torch-xla 2.9 has
      no lowering for ``searchsorted`` (it falls back to the CPU, ``aten::searchsorted``).
    * ``"merge"``: only static-shape ops XLA lowers (``sort``, ``cumsum``, ``scatter``):
      one stable sort of ``cat([history, losses])`` (equal history values sort before the
      loss: ``#{h <= l}``) and one of ``cat([losses, history])`` (``#{h < l}``);
      O((H + B) log(H + B)). Histories longer than ``MAX_SORT_LENGTH - B`` are merged in
      chunks (one batched sort), so no sort exceeds Neuron's TopK limit; B must be below
      ``MAX_SORT_LENGTH``.
    """
    check_method(method)
    valid = _slots_in_use(history, fill, slots)  # [H]
    padded = torch.where(valid, history, torch.full_like(history, float("inf")))
    padded = torch.where(padded == 0, torch.zeros_like(padded), padded)  # -0.0 -> 0.0
    l = losses.to(history.dtype)
    nan = torch.isnan(l)
    l = torch.where(nan | (l == 0), torch.zeros_like(l), l)
    n = fill.to(torch.int64)
    if method == "search":
        ordered = torch.sort(padded).values
        less = torch.searchsorted(ordered, l, side="left")
        not_greater = torch.searchsorted(ordered, l, side="right")
    else:
        less, not_greater = _merge_counts(padded, l)
    less = torch.clamp(less, max=n)
    not_greater = torch.clamp(not_greater, max=n)
    none = torch.zeros_like(less)
    less = torch.where(nan, none, less)
    equal = torch.where(nan, none, not_greater - less)
    denom = torch.clamp(fill, min=1).to(history.dtype)
    pct = (less.to(history.dtype) + 0.5 * equal.to(history.dtype)) / denom
    return torch.where(fill > 0, pct, torch.ones_like(pct))


# B x H from which the sort-based formulation is the faster one, per method: where each
# threshold lies is measured by benchmarks/machinery.py (eager CPU for "search", torch-xla's
# CPU backend for "merge"). Eagerly the pairwise comparison pays B x H work while sorting
# the history once and searching it pays H log H + B log H, so sorting wins from modest
# sizes on. Traced by XLA, the pairwise comparison is one fused reduction of few ops while
# the merge sorts (H + B) values twice, so the crossover sits far higher.
SORTED_PERCENTILE_MIN_CELLS = 65536  # method "search"
SORTED_PERCENTILE_MIN_CELLS_XLA = 2**20 + 1  # method "merge" (XLA)


def percentile_rank_auto(
    losses: torch.Tensor,
    history: torch.Tensor,
    fill: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    method: str = "search",
) -> torch.Tensor:
    """``percentile_rank`` or ``percentile_rank_sorted(method=method)`` (identical results),
    whichever is faster for the static sizes B x H with that method. The choice depends on
    the shapes and the caller's ``method`` only, never on data or on the device: the
    backend passes ``"merge"`` on XLA, ``"search"`` elsewhere. ``"merge"`` also keeps to
    the pairwise comparison when B reaches ``MAX_SORT_LENGTH`` (no sort may be longer)."""
    if check_method(method) == "merge":
        threshold, fits = SORTED_PERCENTILE_MIN_CELLS_XLA, losses.shape[0] < MAX_SORT_LENGTH
    else:
        threshold, fits = SORTED_PERCENTILE_MIN_CELLS, True
    if fits and losses.shape[0] * history.shape[0] >= threshold:
        return percentile_rank_sorted(losses, history, fill, slots, method=method)
    return percentile_rank(losses, history, fill, slots)
