"""The web-like stream (``benchmarks/tasks/lm_web.py``) and the reference slice both corpora
share, on a small folder tree built here (so the rules, not this machine's installation,
are what is checked), and once on the real installation.

Each kind of file gets its own bytes: clean modules one byte from 40 to 79 each, licence
texts lowercase letters, binary files bytes from 128 to 200, and files the rules must not
take bytes 0xEC to 0xEE; a window's bytes then say where it came from."""

import random
import re
from pathlib import Path

import pytest
import torch

from benchmarks.tasks import lm_web
from benchmarks.tasks.lm_corpus import HELDOUT_EVERY, REFERENCE_RESIDUE, corpus_files, cut_windows, read_corpus
from benchmarks.tasks.lm_web import KIND_NAMES, WEB_SHARES, kind_shares, near_copies, near_copy_bytes, read_web_corpus

CONTEXT = 99  # windows of 100 bytes: 3 bytes of a near copy replaced
DECOYS = {0xEC, 0xED, 0xEE}


def _text(seed: int, n: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(97, 123) for _ in range(n))


def _binary(seed: int, n: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(128, 201) for _ in range(n))


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _tree(tmp: Path) -> tuple[Path, list[Path], list[Path]]:
    """A stdlib folder and a site-packages folder; returns the stdlib root, the site
    folders, and the licence files the rule keeps, in its order (root first, sorted).
    Sizes: 160 clean training windows, so the mix needs 80 junk windows, and the 102
    junk windows here hold them."""
    root, site = tmp / "stdlib", tmp / "site"
    for i in range(2 * HELDOUT_EVERY):
        _write(root / f"pkg{i % 3}" / f"m{i:02d}.py", bytes([40 + i]) * (200 + 13 * i))
    licence_a = _text(1, 700)
    kept = [
        _write(root / "LICENSE.txt", licence_a),
        _write(root / "site-packages" / "x-1.0.dist-info" / "NOTICE", _text(2, 650)),
        _write(site / "other-2.0.dist-info" / "licenses" / "COPYING.md", _text(3, 720)),
        _write(site / "pkg-1.0.dist-info" / "licence", _text(4, 610)),
    ]
    _write(site / "dup-1.0.dist-info" / "LICENSE", licence_a)  # the same text again: dropped
    _write(root / "__pycache__" / "m00.cpython-311.pyc", _binary(5, 3000))
    _write(root / "pkg1" / "__pycache__" / "m01.cpython-311.pyc", _binary(6, 2500))
    _write(root / "lib-dynload" / "_a.cpython-311-x86_64-linux-gnu.so", _binary(7, 2000))
    _write(site / "_libs" / "libz.so.1", _binary(8, 1500))  # before lib-dynload by name; after it by root
    _write(site / "_libs" / "native.pyd", _binary(9, 1200))
    (site / "_libs" / "again.so").symlink_to(root / "lib-dynload" / "_a.cpython-311-x86_64-linux-gnu.so")
    # What the rules must leave out: bytecode outside the stdlib's caches, code and icons named
    # like licences, other files.
    _write(root / "stray.pyc", bytes([0xEC]) * 900)
    _write(root / "site-packages" / "__pycache__" / "z.cpython-311.pyc", bytes([0xEC]) * 900)
    _write(site / "pkg" / "license_manager.py", bytes([0xED]) * 900)
    _write(site / "pkg" / "license.svg", bytes([0xED]) * 900)
    _write(root / "notes.txt", bytes([0xEE]) * 900)
    return root, [site], kept


def _rows(t: torch.Tensor) -> list[bytes]:
    return [bytes(r.tolist()) for r in t]


def _pool(kept: list[Path]) -> list[bytes]:
    return _rows(cut_windows(b"".join(p.read_bytes() for p in kept), CONTEXT + 1))


def test_the_reference_slice_is_its_own_files_apart_from_training_and_held_out(tmp_path):
    root, sites, _ = _tree(tmp_path)
    files = corpus_files(root)
    clean = read_corpus(CONTEXT, 4, root)
    by_residue = {
        r: {p.read_bytes()[0] for i, p in enumerate(files) if i % HELDOUT_EVERY == r} for r in range(HELDOUT_EVERY)
    }
    reference, heldout = by_residue[REFERENCE_RESIDUE], by_residue[HELDOUT_EVERY - 1]
    ref_files = [p for i, p in enumerate(files) if i % HELDOUT_EVERY == REFERENCE_RESIDUE]
    assert torch.equal(clean.reference, cut_windows(b"".join(p.read_bytes() for p in ref_files), CONTEXT + 1))
    assert set(clean.reference.unique().tolist()) == reference
    assert not set(clean.train.unique().tolist()) & (reference | heldout)
    assert not set(clean.heldout.unique().tolist()) & reference
    assert clean.kinds.shape == (clean.train.shape[0],) and not clean.kinds.any()
    described = clean.describe()
    assert described["reference_sequences"] == clean.reference.shape[0] > 0
    assert described["reference_bytes"] == sum(p.stat().st_size for p in ref_files)
    assert f"== {REFERENCE_RESIDUE}" in described["reference_rule"] and described["name"] == "clean"
    web = read_web_corpus(CONTEXT, 4, root, sites)
    assert torch.equal(web.reference, clean.reference) and torch.equal(web.heldout, clean.heldout)
    assert sorted(_rows(web.train[web.kinds == 0])) == sorted(_rows(clean.train))


def test_the_sources_are_found_by_their_rules_the_stdlib_first_each_file_once(tmp_path, monkeypatch):
    root, sites, kept = _tree(tmp_path)
    site = sites[0]
    found = lm_web.web_sources(root, sites)
    assert found.boilerplate == [*kept[:2], site / "dup-1.0.dist-info" / "LICENSE", *kept[2:]]
    assert found.bytecode == [
        root / "__pycache__" / "m00.cpython-311.pyc",
        root / "pkg1" / "__pycache__" / "m01.cpython-311.pyc",
    ]
    assert found.shared_libraries == [
        root / "lib-dynload" / "_a.cpython-311-x86_64-linux-gnu.so",  # not again through the link
        site / "_libs" / "libz.so.1",
        site / "_libs" / "native.pyd",
    ]
    assert found.roots == [root, site]
    walked = []
    walk = lm_web.os.walk
    monkeypatch.setattr(lm_web.os, "walk", lambda top: walked.append(Path(top)) or walk(top))
    nested = lm_web.web_sources(root, [root / "site-packages", site])  # a site folder inside the stdlib
    assert walked == [root, site]  # walked once, with the stdlib
    assert (nested.boilerplate, nested.bytecode, nested.shared_libraries) == (
        found.boilerplate,
        found.bytecode,
        found.shared_libraries,
    )


def test_the_shares_hold_to_within_one_window(tmp_path):
    root, sites, _ = _tree(tmp_path)
    web = read_web_corpus(CONTEXT, 4, root, sites)
    n = web.kinds.numel()
    counts = torch.bincount(web.kinds.long(), minlength=len(KIND_NAMES))
    assert n == web.train.shape[0] and n > 100
    for i, name in enumerate(KIND_NAMES):
        assert abs(counts[i].item() - WEB_SHARES[name] * n) <= 1, name
    described = web.describe()
    assert described["kind_counts"] == {name: counts[i].item() for i, name in enumerate(KIND_NAMES)}
    assert described["shares"] == WEB_SHARES and described["name"] == "web-like"


def test_every_window_is_what_its_kind_says(tmp_path):
    root, sites, kept = _tree(tmp_path)
    web = read_web_corpus(CONTEXT, 4, root, sites)
    clean = set(_rows(read_corpus(CONTEXT, 4, root).train))
    pool = _pool(kept)
    index = {w: i for i, w in enumerate(pool)}
    assert len(index) == len(pool) > 1
    k = near_copy_bytes(CONTEXT + 1)
    assert k == 3
    exact_uses = torch.zeros(len(pool), dtype=torch.long)
    for row, kind in zip(_rows(web.train), web.kinds.tolist()):
        assert not DECOYS & set(row)
        if kind == 0:
            assert row in clean
        elif kind == 1:
            exact_uses[index[row]] += 1
        elif kind == 2:
            diffs = [sum(a != b for a, b in zip(row, w)) for w in pool]
            nearest = pool[diffs.index(min(diffs))]
            assert min(diffs) == k
            assert all(0x20 <= a <= 0x7E for a, b in zip(row, nearest) if a != b)
        else:
            assert kind == 3 and all(128 <= b <= 200 for b in row)
    assert exact_uses.max() - exact_uses.min() <= 1 and exact_uses.min() >= 1  # cycled, not drawn at random
    assert web.describe()["components"]["boilerplate"]["files"] == len(kept)


def test_a_near_copy_differs_from_its_window_in_exactly_its_share_of_printable_bytes():
    windows = torch.full((2000, 100), ord("a"), dtype=torch.uint8)  # replacing "a" by "a" must not happen
    copies = near_copies(windows, torch.Generator().manual_seed(0))
    differ = copies != windows
    assert (differ.sum(dim=1) == near_copy_bytes(100)).all()
    changed = copies[differ]
    assert ((changed >= 0x20) & (changed <= 0x7E)).all()
    assert near_copy_bytes(10) == 1 and near_copy_bytes(200) == 6


def test_junk_is_read_in_path_order_up_to_its_cap_and_too_little_of_it_is_an_error(tmp_path, monkeypatch):
    root, sites, _ = _tree(tmp_path)
    monkeypatch.setattr(lm_web, "JUNK_BYTES_EACH", 4000)
    components = read_web_corpus(CONTEXT, 4, root, sites).describe()["components"]
    # 3000 bytes of the first .pyc, 1000 of the second; 2000 + 1500 of the first two shared
    # libraries, 500 of the third (lib-dynload first: the stdlib before the site folder).
    assert components["bytecode"] == {"files": 2, "files_found": 2, "bytes": 4000, "windows": 40}
    assert components["shared_libraries"] == {"files": 3, "files_found": 3, "bytes": 4000, "windows": 40}
    assert components["junk"] == {"windows": 80, "drawn": 80}
    monkeypatch.setattr(lm_web, "JUNK_BYTES_EACH", 500)
    with pytest.raises(ValueError, match="junk share needs"):
        read_web_corpus(CONTEXT, 4, root, sites)


def test_the_checksum_is_the_same_on_a_second_build_and_moves_when_any_component_file_changes(tmp_path):
    root, sites, kept = _tree(tmp_path)
    first = read_web_corpus(CONTEXT, 4, root, sites)
    again = read_web_corpus(CONTEXT, 4, root, sites)
    assert first.sha256 == again.sha256 and torch.equal(first.train, again.train)
    assert torch.equal(first.kinds, again.kinds)
    _write(root / "notes.txt", b"not a component")
    assert read_web_corpus(CONTEXT, 4, root, sites).sha256 == first.sha256
    seen = {first.sha256}
    for path in (
        corpus_files(root)[0],
        kept[2],
        root / "pkg1" / "__pycache__" / "m01.cpython-311.pyc",
        sites[0] / "_libs" / "native.pyd",
    ):
        data = path.read_bytes()
        _write(path, data[:-1] + bytes([data[-1] ^ 1]))
        sha = read_web_corpus(CONTEXT, 4, root, sites).sha256
        assert sha not in seen, path
        seen.add(sha)


@pytest.mark.parametrize("missing", ["licence files", "compiled bytecode", "shared libraries"])
def test_a_component_without_files_is_an_error_that_names_it_and_where(tmp_path, missing):
    root, sites, kept = _tree(tmp_path)
    site = sites[0]
    component = {
        "licence files": [*kept, site / "dup-1.0.dist-info" / "LICENSE"],
        "compiled bytecode": [
            root / "__pycache__" / "m00.cpython-311.pyc",
            root / "pkg1" / "__pycache__" / "m01.cpython-311.pyc",
        ],
        "shared libraries": [
            root / "lib-dynload" / "_a.cpython-311-x86_64-linux-gnu.so",
            site / "_libs" / "libz.so.1",
            site / "_libs" / "native.pyd",
        ],
    }[missing]
    for path in component:
        path.unlink()
    with pytest.raises(FileNotFoundError, match=f"no {missing}.* under {re.escape(str(root))}"):
        read_web_corpus(CONTEXT, 4, root, sites)


def test_repeats_cycle_through_the_pool_so_no_window_comes_twice_more_than_another():
    g = torch.Generator().manual_seed(0)
    for pool, count in ((5, 12), (5, 5), (7, 3), (4, 0)):
        drawn = lm_web._cycled(pool, count, g)
        assert drawn.shape == (count,)
        uses = torch.bincount(drawn, minlength=pool)
        assert uses.max() - uses.min() <= 1 and uses.sum() == count


def test_licence_texts_shorter_than_a_window_are_an_error(tmp_path):
    root, sites, kept = _tree(tmp_path)
    for path in kept[1:]:
        path.unlink()
    _write(kept[0], b"short")  # the duplicate in the site folder is now a second text
    (sites[0] / "dup-1.0.dist-info" / "LICENSE").write_bytes(b"short too")
    with pytest.raises(ValueError, match="less than one window"):
        read_web_corpus(CONTEXT, 4, root, sites)


def test_kind_shares_are_the_kinds_of_the_given_windows():
    kinds = torch.tensor([0, 0, 1, 2, 3, 3, 3, 0], dtype=torch.uint8)
    shares = kind_shares(kinds, [0, 1, 2, 4])
    assert shares == {"clean": 0.5, "boilerplate_exact": 0.25, "boilerplate_near": 0.0, "junk": 0.25}
    assert kind_shares(kinds, torch.tensor([3, 3])) == {
        "clean": 0.0,
        "boilerplate_exact": 0.0,
        "boilerplate_near": 1.0,
        "junk": 0.0,
    }
    with pytest.raises(ValueError, match="no window"):
        kind_shares(kinds, [])
    with pytest.raises(ValueError, match="outside"):
        kind_shares(torch.tensor([0, 4], dtype=torch.uint8), [0, 1])


def test_this_installation_builds_a_web_stream_with_every_component():
    web = read_web_corpus(16, 8)
    described = web.describe()
    for name, part in described["components"].items():
        assert part["windows"] > 0, name
    assert all(part["files"] > 0 for name, part in described["components"].items() if name != "junk")
    assert all(described["kind_counts"][name] > 0 for name in KIND_NAMES)
    assert web.reference.shape[0] > 0 and web.heldout.shape[0] == 8
    assert len(described["sha256"]) == 64 and described["sha256"] != described["clean_sha256"]
