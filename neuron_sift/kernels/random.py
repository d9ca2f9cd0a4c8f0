"""Counter-based random numbers computed by integer hashing on the device.

Why not ``torch.rand``: a device RNG's stream differs between CPU, CUDA and XLA, passing
``generator=`` makes XLA random ops fall back to the CPU, and its state is awkward to
checkpoint. A hash of ``(seed, counter, row)`` needs no hidden state: the same seed and
counter give the same uniforms on every backend, and resuming only needs the counter.

All arithmetic is kept within 31 bits (every product is masked back to 31 bits, every
shift is applied to a non-negative value), so the result is identical whether the
integers are int64, or demoted to int32 by a compiler (as Neuron does), where products
wrap: the low 31 bits of a product do not depend on the width.
"""

import torch

_MASK31 = 0x7FFFFFFF
_M1 = 0x2C1B3C6D
_M2 = 0x297A2D39
_GOLDEN = 0x1E3779B9


def _mix31(x: torch.Tensor) -> torch.Tensor:
    """A multiply-xorshift avalanche on 31-bit non-negative integers."""
    x = x & _MASK31
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK31
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK31
    x = x ^ (x >> 16)
    return x


def seed_key(seed: torch.Tensor) -> torch.Tensor:
    """The part of the hash that depends on the seed alone: compute it once per seed."""
    return _mix31(seed.to(torch.int64) + _GOLDEN)


def row_keys(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, row hash)`` for ``n`` rows: the part of the hash that depends on the row alone."""
    rows = torch.arange(n, device=device, dtype=torch.int64)
    return rows, _mix31(rows + _GOLDEN)


def uniform_from_keys(
    seed_mix: torch.Tensor, counter: torch.Tensor, rows: torch.Tensor, row_hash: torch.Tensor
) -> torch.Tensor:
    """``uniform_from_counter`` from precomputed ``seed_key`` and ``row_keys``: identical values.

    Per draw only the counter changes; on XLA every op is traced anew for each source
    batch, so the parts that never change are computed once and passed in.
    """
    key = _mix31(seed_mix ^ (counter.to(torch.int64) & _MASK31))
    h = _mix31(_mix31(key ^ row_hash) + rows)
    top23 = (h >> 8).to(torch.float32)  # 31 - 8 = 23 bits: top23 + 0.5 is exact in float32
    return (top23 + 0.5) * (1.0 / 8388608.0)


def uniform_from_counter(seed: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` float32 uniforms in the open interval (0, 1) for draw number ``counter``.

    ``seed`` and ``counter`` are int64 scalar tensors on the device; ``n`` is static.
    Values are ``(j + 0.5) * 2**-23`` for a 23-bit integer ``j``: every such value is
    exact in float32 (24 significant bits), so neither 0 nor 1 occurs (safe for
    ``log(-log(u))``). With 24 random bits the half-step offset would need 25 bits, and
    the largest value would round to exactly 1.0.
    """
    rows, row_hash = row_keys(n, counter.device)
    return uniform_from_keys(seed_key(seed), counter, rows, row_hash)
