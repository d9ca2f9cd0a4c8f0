"""Refuse, at construction, ranks whose loaders were built with different settings.

Why: under data parallelism every rank runs the same collectives at the same points and,
for the epoch loader, plans the same global epoch. Settings that decide those plans or
points (a dataset length, a budget, a batch size, a seed, a mode) differing between ranks
give either a wait in a later collective until the process group's timeout, a collective
mismatch, or, worst, a run that ends with each rank on its own plan and no word said. One
all-gather of a fixed-shape row at construction catches all of them, on every rank at once:
every rank receives the same rows, so every rank raises the same error (none is left
waiting in a later collective), naming each setting that differs and its value on each rank.

A row holds two int64 per setting, its kind and its value (a float by its float64 bits, a
string by its index among the setting's choices), so values compare exactly and each rank
can print every rank's value back.
"""

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from neuron_sift.shared.ranks import RankGroup

_NONE, _BOOL, _INT, _FLOAT, _CHOICE = range(5)

Value = bool | int | float | str | None


@dataclass(frozen=True)
class Setting:
    """One setting every rank must share: ``name`` as the user knows it, ``value`` (None,
    a bool, an int that fits int64, a float, or a string among ``choices``) and ``hint``,
    what to do when it differs (added to the error once)."""

    name: str
    value: Value
    choices: tuple[str, ...] = ()
    hint: str = ""


def encode(setting: Setting) -> tuple[int, int]:
    """``setting``'s value as (kind, int64 payload)."""
    v = setting.value
    if v is None:
        return _NONE, 0
    if isinstance(v, bool):
        return _BOOL, int(v)
    if isinstance(v, Integral):
        return _INT, int(v)
    if isinstance(v, Real):
        return _FLOAT, struct.unpack("<q", struct.pack("<d", float(v)))[0]
    if isinstance(v, str) and v in setting.choices:
        return _CHOICE, setting.choices.index(v)
    raise TypeError(f"setting {setting.name}: cannot compare {v!r} across ranks (choices {setting.choices})")


def decode(setting: Setting, kind: int, payload: int) -> Value:
    """The value a rank's (kind, payload) stands for (``setting`` gives the choices)."""
    if kind == _BOOL:
        return bool(payload)
    if kind == _INT:
        return payload
    if kind == _FLOAT:
        return float(struct.unpack("<d", struct.pack("<q", payload))[0])
    if kind == _CHOICE:
        return setting.choices[payload]
    return None


def settings_row(settings: Sequence[Setting]) -> torch.Tensor:
    """The ``[1, 2 * len(settings)]`` int64 row this rank contributes."""
    return torch.tensor([[x for s in settings for x in encode(s)]], dtype=torch.int64)


def differences(settings: Sequence[Setting], rows: torch.Tensor) -> list[tuple[Setting, str]]:
    """Each setting whose value differs between the gathered ``rows`` (one per rank, in rank
    order), with a line naming it and each rank's value, ranks of one value grouped."""
    pairs = rows.reshape(rows.shape[0], len(settings), 2).tolist()
    found = []
    for i, setting in enumerate(settings):
        column = [(int(rank[i][0]), int(rank[i][1])) for rank in pairs]
        if all(c == column[0] for c in column):
            continue
        ranks_of: dict[tuple[int, int], list[int]] = {}
        for rank, c in enumerate(column):
            ranks_of.setdefault(c, []).append(rank)
        values = "; ".join(f"{_ranks(r)}: {decode(setting, *c)!r}" for c, r in ranks_of.items())
        found.append((setting, f"{setting.name} differs between ranks: {values}"))
    return found


def _ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``ranks 0-2, 5``; one rank as ``rank 3``."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def check_same_settings(settings: Sequence[Setting], ranks: RankGroup, owner: str, advice: str) -> None:
    """Raise ``ValueError`` on every rank when any of ``settings`` differs between ranks.

    One all-gather of ``16 * len(settings)`` bytes per rank, under data parallelism only.
    Call it on every rank at the same point of construction whatever its settings (a check
    some ranks skip would leave the others waiting in it). ``owner`` names the loader,
    ``advice`` says what to do; each differing setting's own hint follows.
    """
    if not ranks.active:
        return
    rows = ranks.all_gather_rows(settings_row(settings))
    found = differences(settings, rows)
    if not found:
        return
    hints = dict.fromkeys(s.hint for s, _ in found if s.hint)  # each once, in the settings' order
    raise ValueError(
        f"{owner} was built with different settings on different ranks, so the ranks would not run in step "
        f"(a collective waiting until the process group's timeout, or each rank training its own plan):\n  "
        + "\n  ".join(line for _, line in found)
        + f"\n{advice}"
        + "".join(f"\n{h}" for h in hints)
    )
