"""Loaders built on ranks that are threads of this process: ``torch.distributed`` patched with a
``ThreadWorld`` (``tests/neuron_sift/epoch/thread_ranks.py``), so each loader's own
``RankGroup`` sees an initialised gloo group and its collectives reach the other threads."""

from collections.abc import Callable
from typing import Any

from tests.neuron_sift.epoch.thread_ranks import ThreadWorld


def build_on_ranks(monkeypatch, world: int, build: Callable[[int], Any]) -> list[Any]:
    """``build(rank)`` on ``world`` ranks at once; each rank's result, or the ``ValueError`` it
    raised (a rank that raises anything else, or waits in a collective its peers never call,
    fails the test)."""
    w = ThreadWorld(world)
    w.patch(monkeypatch)

    def attempt(rank: int) -> Any:
        try:
            return build(rank)
        except ValueError as exc:
            return exc

    return w.run([lambda r=r: attempt(r) for r in range(world)])
