"""The single-pass language-model task's web-like stream (``lm_suite.py --corpus web``):
clean text mixed with repeated boilerplate and junk at fixed shares, the way web crawls
are, built only from real files the running Python's installation holds (nothing is
downloaded, and no byte is made up but the near copies' replaced ones).

Why a second stream: on the clean corpus (``lm_corpus.py``) every window is source code or
prose, with little for a sifting rule to skip. A crawl is not like that: much of it is
boilerplate repeated verbatim or nearly (licences, footers) and some of it is not text at
all. A rule that skips by excess loss (the learner's loss minus a reference model's, the
reference trained on ``Corpus.reference``) should skip those, and this stream is where that
can be seen to pay or not. The metric stays bits per byte on the clean corpus's held-out
files, so both streams are judged on the same text.

The components (``web_sources``; paths sorted, the stdlib's before each site folder's):

- clean: every training window of the clean corpus (its held-out and reference files stay
  out, so the evaluation and the reference slice are the clean corpus's).
- boilerplate: licence texts: files whose name starts with LICENSE, LICENCE, COPYING or
  NOTICE (any case) under the stdlib folder and the site-packages folders (``sysconfig``'s
  ``purelib`` and ``platlib``: mostly in ``*.dist-info/``), but not code, bytecode or
  images named like them (``NOT_LICENSE_SUFFIXES``: a ``license_manager.py`` is code, a
  ``license.svg`` an icon); a text an earlier file already had is dropped; concatenated and
  cut into windows. The stream repeats them: exact copies, and near copies with
  ``NEAR_COPY_SHARE`` of their bytes (rounded, at least one) replaced by other, seeded
  printable ASCII, as a crawl's copies differ by a date or a name.
- junk: bytes that are not text: compiled bytecode (``*.pyc`` in the stdlib's
  ``__pycache__`` folders, outside those the clean rule leaves out: its site-packages and
  test suites) and shared libraries (``*.so``, ``*.so.*``, ``*.pyd``, ``*.dylib`` anywhere
  under the stdlib, ``lib-dynload`` among it, and the site folders), each read in path
  order up to ``JUNK_BYTES_EACH`` bytes (the last file cut there), so that the corpus
  builds in seconds whatever is installed.

The mix (``WEB_SHARES``): every clean training window is kept, and the other kinds are
drawn to reach their shares of the whole: boilerplate by cycling through seeded
permutations of the licence windows (each used once before any is used twice, so the
repetition is the share's, not the draw's), junk without repetition (a share the bytes
read cannot fill is an error). The windows are then interleaved by one permutation from
``WEB_SEED``, the same on every run; a run seed's ``stream_order`` permutes the stream
again, as on the clean corpus. ``Corpus.kinds`` says what each window is (``KIND_NAMES``).

The checksum: one SHA-256 over every component file's bytes as read, in the order above
(the clean files, held-out and reference ones among them; the kept licence texts; the junk
bytes read), then the shares, the seed and the near-copy share. Installed packages are part
of the stream, so another environment, or one more package, is another checksum, and its
records say so.
"""

import hashlib
import json
import math
import os
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.tasks.lm_corpus import (
    EXCLUDED_DIRS,
    HELDOUT_EVERY,
    REFERENCE_RESIDUE,
    Corpus,
    corpus_files,
    cut_windows,
    read_corpus,
    stdlib_root,
)

KIND_NAMES = ("clean", "boilerplate_exact", "boilerplate_near", "junk")  # Corpus.kinds holds the index
WEB_SHARES = {"clean": 0.5, "boilerplate_exact": 0.125, "boilerplate_near": 0.125, "junk": 0.25}
WEB_SEED = 2718  # the draws, the near copies' bytes and the interleaving; the same for every run seed
NEAR_COPY_SHARE = 0.03  # of a near copy's bytes replaced
JUNK_BYTES_EACH = 8 * 2**20  # bytes read of each junk source (bytecode, shared libraries)
LICENSE_PREFIXES = ("license", "licence", "copying", "notice")
NOT_LICENSE_SUFFIXES = frozenset({".py", ".pyi", ".pyc", ".svg", ".png", ".gif", ".jpg", ".jpeg", ".ico"})
PRINTABLE = (0x20, 0x7E)  # the near copies' replacement bytes, both ends included


def site_roots() -> list[Path]:
    """The installation's site-packages folders (``purelib`` and ``platlib``, once each)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[key]) for key in ("purelib", "platlib")))


def _is_licence(name: str) -> bool:
    return name.lower().startswith(LICENSE_PREFIXES) and Path(name).suffix.lower() not in NOT_LICENSE_SUFFIXES


def _is_shared_library(name: str) -> bool:
    parts = name.lower().split(".")[1:]
    return "so" in parts or parts[-1:] in (["pyd"], ["dylib"])


@dataclass
class WebSources:
    """The non-clean components' files, each list in sorted path order; ``roots``: where
    they were looked for (the stdlib first), for the error that names them."""

    boilerplate: list[Path]
    bytecode: list[Path]
    shared_libraries: list[Path]
    roots: list[Path]


def web_sources(root: Path | None = None, sites: Sequence[Path] | None = None) -> WebSources:
    """The files of each non-clean component under ``root`` (default: the stdlib) and
    ``sites`` (default: ``site_roots()``), one walk of each folder; a site folder inside
    ``root`` is walked with it, and a file reached twice (a link) counts once."""
    root = stdlib_root() if root is None else Path(root)
    sites = site_roots() if sites is None else [Path(s) for s in sites]
    roots = [root, *dict.fromkeys(s for s in sites if s != root)]
    walked = [root] + [s for s in roots[1:] if s.is_dir() and not s.resolve().is_relative_to(root.resolve())]
    found: dict[str, list[tuple[int, str, Path]]] = {"boilerplate": [], "bytecode": [], "shared_libraries": []}
    for index, top in enumerate(walked):
        for dirpath, _dirs, names in os.walk(top):
            rel_dir = Path(dirpath).relative_to(top)
            in_stdlib_cache = index == 0 and rel_dir.name == "__pycache__" and not EXCLUDED_DIRS & set(rel_dir.parts)
            for name in names:
                if in_stdlib_cache and name.endswith(".pyc"):
                    kind = "bytecode"
                elif _is_shared_library(name):
                    kind = "shared_libraries"
                elif _is_licence(name):
                    kind = "boilerplate"
                else:
                    continue
                found[kind].append((index, (rel_dir / name).as_posix(), Path(dirpath, name)))
    lists: dict[str, list[Path]] = {}
    for kind, entries in found.items():
        seen: set[str] = set()
        lists[kind] = []
        for _, _, path in sorted(entries, key=lambda e: e[:2]):
            real = os.path.realpath(path)
            if path.is_file() and real not in seen:
                seen.add(real)
                lists[kind].append(path)
    return WebSources(roots=roots, **lists)


def _read_capped(files: list[Path], cap: int) -> tuple[bytes, int]:
    """The files' bytes in order up to ``cap`` (the last file cut there), and how many files were read."""
    parts, total, read = [], 0, 0
    for path in files:
        if total >= cap:
            break
        with open(path, "rb") as f:
            data = f.read(cap - total)
        parts.append(data)
        total += len(data)
        read += 1
    return b"".join(parts), read


def _cycled(pool: int, count: int, g: torch.Generator) -> torch.Tensor:
    """``count`` indices into ``pool`` items: whole seeded permutations one after another, so
    no item comes a second time before every item has come once."""
    if count == 0:
        return torch.empty(0, dtype=torch.long)
    return torch.cat([torch.randperm(pool, generator=g) for _ in range(math.ceil(count / pool))])[:count]


def near_copy_bytes(width: int) -> int:
    """Bytes replaced in a near copy of a window of ``width`` bytes."""
    return max(1, round(NEAR_COPY_SHARE * width))


def near_copies(windows: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Each window with ``near_copy_bytes`` of its bytes, at seeded distinct positions,
    replaced by a printable ASCII byte other than the one there (so each differs from its
    source in exactly that many bytes)."""
    n, width = windows.shape
    k = near_copy_bytes(width)
    out = windows.clone()
    if n == 0:
        return out
    positions = torch.rand(n, width, generator=g).argsort(dim=1)[:, :k]
    low, high = PRINTABLE
    span = high - low + 1
    drawn = torch.randint(0, span, (n, k), generator=g)
    original = out.gather(1, positions).long()
    value = low + drawn
    same = value == original
    value[same] = low + (drawn[same] + 1) % span
    out.scatter_(1, positions, value.to(torch.uint8))
    return out


def _missing(what: str, roots: list[Path]) -> FileNotFoundError:
    return FileNotFoundError(
        f"web-like corpus: no {what} under {', '.join(str(r) for r in roots)}; "
        "each component must have files on this installation (benchmarks/tasks/lm_web.py)"
    )


def read_web_corpus(
    context: int, heldout_sequences: int, root: Path | None = None, sites: Sequence[Path] | None = None
) -> Corpus:
    """The web-like stream over the clean corpus of ``root`` (default: the stdlib), with
    boilerplate and junk found under ``root`` and ``sites`` (default: ``site_roots()``):
    the held-out and reference windows are the clean corpus's."""
    root = stdlib_root() if root is None else Path(root)
    clean = read_corpus(context, heldout_sequences, root)
    width = context + 1
    sources = web_sources(root, sites)
    if not sources.boilerplate:
        raise _missing(
            "licence files (names starting with LICENSE, LICENCE, COPYING or NOTICE, any case)", sources.roots
        )
    if not sources.bytecode:
        raise _missing("compiled bytecode (*.pyc in the stdlib's __pycache__ folders)", sources.roots[:1])
    if not sources.shared_libraries:
        raise _missing("shared libraries (*.so*, *.pyd, *.dylib)", sources.roots)
    digest = hashlib.sha256()
    clean_files = corpus_files(root)
    for path in clean_files:
        digest.update(path.read_bytes())
    texts: list[bytes] = []
    seen: set[str] = set()
    for path in sources.boilerplate:
        data = path.read_bytes()
        key = hashlib.sha256(data).hexdigest()
        if data and key not in seen:
            seen.add(key)
            texts.append(data)
    licence = b"".join(texts)
    bytecode, bytecode_read = _read_capped(sources.bytecode, JUNK_BYTES_EACH)
    shared, shared_read = _read_capped(sources.shared_libraries, JUNK_BYTES_EACH)
    for data in (*texts, bytecode, shared):
        digest.update(data)
    digest.update(
        json.dumps({"shares": WEB_SHARES, "seed": WEB_SEED, "near": NEAR_COPY_SHARE}, sort_keys=True).encode()
    )
    pool = cut_windows(licence, width)
    junk_pool = torch.cat([cut_windows(bytecode, width), cut_windows(shared, width)])
    n_clean = int(clean.train.shape[0])
    total = round(n_clean / WEB_SHARES["clean"])
    counts = {kind: round(share * total) for kind, share in WEB_SHARES.items() if kind != "clean"}
    if pool.shape[0] == 0:
        raise ValueError(f"web-like corpus: the licence files hold {len(licence)} bytes, less than one window")
    if counts["junk"] > junk_pool.shape[0]:
        raise ValueError(
            f"web-like corpus: the junk share needs {counts['junk']} windows and the junk read holds "
            f"{junk_pool.shape[0]} (JUNK_BYTES_EACH = {JUNK_BYTES_EACH} bytes of each source)"
        )
    g = torch.Generator().manual_seed(WEB_SEED)
    exact = pool[_cycled(pool.shape[0], counts["boilerplate_exact"], g)]
    near = near_copies(pool[_cycled(pool.shape[0], counts["boilerplate_near"], g)], g)
    junk = junk_pool[torch.randperm(junk_pool.shape[0], generator=g)[: counts["junk"]]]
    parts = (clean.train, exact, near, junk)
    kinds = torch.cat([torch.full((p.shape[0],), i, dtype=torch.uint8) for i, p in enumerate(parts)])
    order = torch.randperm(kinds.shape[0], generator=g)
    train = torch.cat(parts)[order]
    training_files = sum(
        1 for i in range(len(clean_files)) if i % HELDOUT_EVERY not in (HELDOUT_EVERY - 1, REFERENCE_RESIDUE)
    )
    components = {
        "clean": {"files": training_files, "bytes": clean.train_bytes, "windows": n_clean},
        "boilerplate": {
            "files": len(texts),
            "files_found": len(sources.boilerplate),
            "bytes": len(licence),
            "windows": int(pool.shape[0]),
            "exact_copies": counts["boilerplate_exact"],
            "near_copies": counts["boilerplate_near"],
            "near_copy_bytes_replaced": near_copy_bytes(width),
        },
        "bytecode": {
            "files": bytecode_read,
            "files_found": len(sources.bytecode),
            "bytes": len(bytecode),
            "windows": len(bytecode) // width,
        },
        "shared_libraries": {
            "files": shared_read,
            "files_found": len(sources.shared_libraries),
            "bytes": len(shared),
            "windows": len(shared) // width,
        },
        "junk": {"windows": int(junk_pool.shape[0]), "drawn": counts["junk"]},
    }
    sha = digest.hexdigest()
    return Corpus(
        train=train,
        heldout=clean.heldout,
        reference=clean.reference,
        kinds=kinds[order],
        context=context,
        n_files=len(clean_files) + len(texts) + bytecode_read + shared_read,
        n_bytes=clean.n_bytes + len(licence) + len(bytecode) + len(shared),
        sha256=sha,
        train_bytes=int(train.numel()),
        heldout_bytes=clean.heldout_bytes,
        reference_bytes=clean.reference_bytes,
        root=str(root),
        name="web-like",
        mix={
            "corpus": "web-like: stdlib *.py, licence texts repeated, bytecode and shared libraries (byte-level)",
            "rule": "core/lm_web.py: the clean corpus's training windows, licence windows as exact and near "
            "copies, junk windows of bytecode and shared libraries, interleaved by a seeded permutation",
            "site_roots": [str(s) for s in sources.roots[1:]],
            "components": components,
            "shares": dict(WEB_SHARES),
            "kind_counts": {name: int((kinds == i).sum()) for i, name in enumerate(KIND_NAMES)},
            "data_seed": WEB_SEED,
            "near_copy_share": NEAR_COPY_SHARE,
            "junk_bytes_each": JUNK_BYTES_EACH,
            "clean_sha256": clean.sha256,
        },
    )


def kind_shares(kinds: torch.Tensor, ids: torch.Tensor | Sequence[int]) -> dict[str, float]:
    """The share of each kind among the windows ``ids`` (indices into ``Corpus.train``): what
    an arm trained on, set beside what the stream held."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() == 0:
        raise ValueError("kind_shares: no window ids")
    counts = torch.bincount(kinds[ids].long(), minlength=len(KIND_NAMES))
    if counts.numel() > len(KIND_NAMES):
        raise ValueError(f"kind_shares: a kind outside 0..{len(KIND_NAMES) - 1}")
    return {name: counts[i].item() / ids.numel() for i, name in enumerate(KIND_NAMES)}
