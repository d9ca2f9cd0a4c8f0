"""Loss-history ring buffer update with static shapes."""

import torch


def ring_buffer_update(
    history: torch.Tensor,
    pos: torch.Tensor,
    fill: torch.Tensor,
    values: torch.Tensor,
    write: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append ``values[write]`` (in order) to the ring buffer ``history``.

    ``history`` is ``[H]``, ``pos`` the next slot to write, ``fill`` how many slots are
    valid; ``write`` is a bool mask ``[B]`` of the values to record (valid and finite).
    Rows not written go to a scratch slot ``H`` of a temporary ``[H + 1]`` buffer, so the
    scatter has a static index shape and never needs ``nonzero``. When more than ``H``
    values are written at once only the last ``H`` land, so no two writes share a slot
    and the result does not depend on scatter ordering.

    Returns ``(history, pos, fill)``, all new tensors.
    """
    h = history.shape[0]
    w = write.to(torch.int64)
    n_write = w.sum()
    rank = torch.cumsum(w, dim=0) - 1  # order among written rows
    lands = write & (rank >= n_write - h)
    slot = torch.remainder(pos + rank, h)
    index = torch.where(lands, slot, torch.full_like(slot, h))
    extended = torch.cat([history, history.new_zeros(1)])
    extended = extended.scatter(0, index, values.to(history.dtype))
    new_history = extended[:h]
    new_pos = torch.remainder(pos + n_write, h)
    new_fill = torch.clamp(fill + n_write, max=h)
    return new_history, new_pos, new_fill
