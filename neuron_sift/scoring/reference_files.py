"""The on-disk layout of a reference-loss table: one manifest, one shard file per scoring rank.

Why this layout: the table is written by ``score_dataset`` (each rank its own shard, no
gather of all losses on one rank) and read by the loaders on every rank, possibly for a
dataset of billions of samples. Sharding by ``id % W`` is the epoch loader's sharded score
table's rule: every shard holds ``len(range(r, n, W))`` slots, slot ``id // W``, so an id's
place is computed, never looked up in an index. Shards are read with ``mmap=True``, so a
lookup touches only the pages it reads. Every file is written to a temporary name and moved
into place with ``os.replace``, so an interrupted run leaves either the old file or the new
one, never half of one.

The contract (``docs/reference-losses.md``)::

    manifest.json: {"format", "version", "n", "shards": W, "fingerprint", "description",
                    "ids_sha256", "covered"}
    shard-{r:05d}-of-{W:05d}.pt: {"format", "version", "n", "shards", "rank", "losses", "done"}
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = "neuron_sift.reference_losses"
VERSION = 1
MANIFEST = "manifest.json"
RESCORE = "rerun score_dataset with the same arguments"


def shard_name(rank: int, shards: int) -> str:
    return f"shard-{rank:05d}-of-{shards:05d}.pt"


def shard_size(n: int, shards: int, rank: int) -> int:
    """Slots of shard ``rank``: the ids ``rank, rank + W, ...`` below ``n``."""
    return len(range(rank, n, shards))


def ids_sha256(ids: np.ndarray | None, n: int) -> str | None:
    """The digest of the scored ids (sorted, unique, int64 little-endian); None when they are all of ``0 .. n-1``."""
    if ids is None or (ids.shape[0] == n and n > 0 and int(ids[0]) == 0 and int(ids[-1]) == n - 1):
        return None
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i8").tobytes()).hexdigest()


def manifest(
    n: int, shards: int, fingerprint: str | None, description: str, ids_digest: str | None, covered: int
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "n": n,
        "shards": shards,
        "fingerprint": fingerprint,
        "description": description,
        "ids_sha256": ids_digest,
        "covered": covered,
    }


def _replace_atomically(path: Path, write: Any) -> None:
    """``write(file)`` into a temporary file beside ``path``, flushed to disk, then moved onto ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with_tmp = Path(tmp)
        if with_tmp.exists():
            with_tmp.unlink()
        raise


def write_manifest(folder: Path, content: dict[str, Any]) -> None:
    text = json.dumps(content, indent=1, sort_keys=True).encode("utf-8")
    _replace_atomically(folder / MANIFEST, lambda f: f.write(text))


def write_shard(folder: Path, n: int, shards: int, rank: int, losses: torch.Tensor, done: int) -> None:
    state = {
        "format": FORMAT,
        "version": VERSION,
        "n": n,
        "shards": shards,
        "rank": rank,
        "losses": losses.detach().to(torch.float32).contiguous(),
        "done": int(done),
    }
    _replace_atomically(folder / shard_name(rank, shards), lambda f: torch.save(state, f))


def _fail(folder: Path, what: str, todo: str) -> ValueError:
    return ValueError(f"cannot load the reference table at {folder}: {what}; {todo}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of ``folder``, its fields checked; ValueError naming the folder and what is wrong."""
    if not folder.is_dir():
        raise _fail(folder, "no such folder", "write it with neuron_sift.score_dataset first, or check the path")
    file = folder / MANIFEST
    if not file.is_file():
        raise _fail(folder, f"it has no {MANIFEST}, so it is not a reference table", "check the path or rescore")
    try:
        content = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(folder, f"{MANIFEST} is damaged ({exc})", f"remove the folder and {RESCORE}") from exc
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        found = content.get("format") if isinstance(content, dict) else type(content).__name__
        raise _fail(folder, f"{MANIFEST} has format {found!r}, not {FORMAT!r}", "check the path")
    if content.get("version") != VERSION:
        raise _fail(
            folder,
            f"it is version {content.get('version')!r} of the layout, this neuron_sift reads version {VERSION}",
            "use the neuron_sift version that wrote it, or rescore with this one",
        )
    n: int = content["n"] if _is_int(content.get("n")) else -1
    problems = [
        key
        for key, ok in (
            ("n", n > 0),
            ("shards", _is_int(content.get("shards")) and content["shards"] > 0),
            ("covered", _is_int(content.get("covered")) and 0 <= content["covered"] <= n),
            ("fingerprint", content.get("fingerprint") is None or isinstance(content["fingerprint"], str)),
            ("ids_sha256", content.get("ids_sha256") is None or isinstance(content["ids_sha256"], str)),
            ("description", isinstance(content.get("description"), str)),
        )
        if not ok
    ]
    if not problems and content["ids_sha256"] is None and content["covered"] != content["n"]:
        problems.append("covered (every id is scored, but covered is not n)")
    if problems:
        raise _fail(folder, f"{MANIFEST} is damaged (field {', '.join(problems)})", f"remove the folder and {RESCORE}")
    return content


def read_shard(folder: Path, head: dict[str, Any], rank: int, mmap: bool = True) -> tuple[torch.Tensor, int]:
    """Shard ``rank``'s losses and ``done``, checked against the manifest ``head``; ValueError otherwise."""
    n, shards = head["n"], head["shards"]
    name = shard_name(rank, shards)
    file = folder / name
    if not file.is_file():
        raise _fail(folder, f"shard {name} is missing", f"{RESCORE} (and as many ranks, {shards}) to write it")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch reports a damaged zip file with several exception types
        raise _fail(
            folder, f"shard {name} cannot be read ({type(exc).__name__}: {exc})", f"remove it and {RESCORE}"
        ) from exc
    size = shard_size(n, shards, rank)
    expected = {"format": FORMAT, "version": VERSION, "n": n, "shards": shards, "rank": rank}
    found = {key: state.get(key) for key in expected} if isinstance(state, dict) else {}
    if found != expected:
        raise _fail(
            folder,
            f"shard {name}'s header {found} disagrees with the manifest {expected}: the folder mixes two tables",
            f"remove the folder and {RESCORE}",
        )
    losses, done = state.get("losses"), state.get("done")
    if not (isinstance(losses, torch.Tensor) and losses.dtype == torch.float32 and tuple(losses.shape) == (size,)):
        got = f"{losses.dtype} {list(losses.shape)}" if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise _fail(folder, f"shard {name} holds {got} losses, not float32 [{size}]", f"remove it and {RESCORE}")
    if not (_is_int(done) and 0 <= done <= size):
        raise _fail(folder, f"shard {name} has done={done!r}, not an int in [0, {size}]", f"remove it and {RESCORE}")
    return losses, done
