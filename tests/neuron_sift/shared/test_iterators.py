"""The iterator-lifetime rule (``neuron_sift.shared.iterators``): a newer iteration, or a
restored state, voids every iterator handed out before it."""

import pytest

from neuron_sift.shared.iterators import IteratorGeneration

VOIDED = r"^Loader: a new iteration was started; this iterator is no longer valid$"


def test_the_newest_iteration_is_the_only_valid_one():
    gen = IteratorGeneration("Loader")
    first = gen.start()
    gen.check(first)
    assert gen.is_current(first)
    second = gen.start()
    assert second != first and gen.is_current(second) and not gen.is_current(first)
    gen.check(second)
    with pytest.raises(RuntimeError, match=VOIDED):
        gen.check(first)


def test_void_all_voids_the_current_iteration_too():
    gen = IteratorGeneration("Loader")
    n = gen.start()
    gen.void_all()
    assert not gen.is_current(n)
    with pytest.raises(RuntimeError, match=VOIDED):
        gen.check(n)
    after = gen.start()
    assert after != n
    gen.check(after)


def test_numbers_never_repeat_and_owners_are_independent():
    a, b = IteratorGeneration("A"), IteratorGeneration("B")
    seen = []
    for _ in range(3):
        seen.append(a.start())
        a.void_all()
    assert len(set(seen)) == 3
    nb = b.start()
    b.check(nb)  # a's iterations do not void b's
    with pytest.raises(RuntimeError, match="^A: a new iteration"):
        a.check(seen[0])
