"""The folder ``score_dataset`` writes into: checked, opened and written shard by shard.

Why checks before any scoring: a rerun on the same path continues an interrupted run, so the
folder must hold a table of the same dataset, ids and number of ranks; anything else would
mix two tables' losses. Every rank reaches the same verdict at the same point (one small
all-reduce), so a refusal is raised on every rank instead of leaving the others waiting in a
later collective. Each rank then keeps its shard's losses on the host and rewrites its shard
file (atomically) at every save.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch

from neuron_sift.scoring import reference_files as files
from neuron_sift.shared.ranks import RankGroup
from neuron_sift.shared.same_settings import Setting, check_same_settings

# What a folder's manifest must share with the call that continues it, as the error names them.
SETTINGS = {
    "n": "dataset size",
    "shards": "number of ranks (shards)",
    "fingerprint": "dataset fingerprint",
    "ids_sha256": "ids scored (sha256 of the ids)",
}


def folder_refusal(folder: Path, want: dict[str, Any]) -> str | None:
    """Why ``folder`` cannot take this call's table (None: new, empty, or the same settings' table)."""
    if not folder.exists():
        return None
    advice = "use another path, or remove the folder to rescore"
    if not folder.is_dir():
        return f"score_dataset: {folder} exists and is not a folder; {advice}"
    if not (folder / files.MANIFEST).is_file():
        if any(folder.iterdir()):
            return f"score_dataset: {folder} holds files but no {files.MANIFEST}, so no reference table; {advice}"
        return None
    try:
        head = files.read_manifest(folder)
    except ValueError as exc:
        return f"score_dataset: {exc}"
    differ = [
        f"{SETTINGS[k]}: the folder's {head[k]!r}, this call's {want[k]!r}" for k in SETTINGS if head[k] != want[k]
    ]
    if differ:
        return (
            f"score_dataset: {folder} holds a reference table written with other settings ("
            + "; ".join(differ)
            + f"); a resume needs the same dataset, ids and number of ranks: {advice}"
        )
    return None


def _digits(text: str | None) -> int | None:
    return None if text is None else int(text[:15], 16)


def open_folder(folder: Path, want: dict[str, Any], ranks: RankGroup) -> None:
    """Refuse a folder of other settings on every rank at once, then make it and its manifest (rank 0)."""
    check_same_settings(
        [
            Setting("dataset size", want["n"]),
            Setting("dataset fingerprint (first 15 hex digits)", _digits(want["fingerprint"])),
            Setting("ids (first 15 hex digits of their sha256; None: every id)", _digits(want["ids_sha256"])),
        ],
        ranks,
        "score_dataset",
        "give score_dataset the same dataset and ids on every rank",
    )
    refusal = folder_refusal(folder, want)
    if int(ranks.sum(torch.tensor([refusal is not None], dtype=torch.int64))[0]):  # every rank raises
        raise ValueError(refusal or f"score_dataset: another rank refused the folder {folder}; see its error")
    if ranks.rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / files.MANIFEST).is_file():
            files.write_manifest(folder, want)
    barrier(ranks)


def barrier(ranks: RankGroup) -> None:
    ranks.sum(torch.zeros(1, dtype=torch.int64))


class ShardWriter:
    """This rank's shard: its losses on the host, how many of its ids are done, saved atomically."""

    def __init__(self, folder: Path, want: dict[str, Any], rank: int, todo: np.ndarray):
        self.folder, self.n, self.shards, self.rank, self.todo = folder, want["n"], want["shards"], rank, todo
        if (folder / files.shard_name(rank, self.shards)).is_file():
            losses, self.done = files.read_shard(folder, want, rank, mmap=False)
            self.losses = losses.clone()
            if self.done > todo.shape[0]:
                raise ValueError(
                    f"score_dataset: shard {files.shard_name(rank, self.shards)} in {folder} has done={self.done}, "
                    f"more than its {todo.shape[0]} ids to score: it is damaged; remove it and rerun"
                )
        else:
            self.losses = torch.full((files.shard_size(self.n, self.shards, rank),), float("nan"))
            self.done = 0
            self.save()

    def save(self) -> None:
        files.write_shard(self.folder, self.n, self.shards, self.rank, self.losses, self.done)

    def record(self, host: torch.Tensor) -> None:
        """Losses of the next ``len(host)`` ids to score; the finite prefix is kept and saved,
        and a non-finite loss is refused naming its sample."""
        host = host.to(torch.float32)
        ids = self.todo[self.done : self.done + host.shape[0]]
        bad = (~torch.isfinite(host)).nonzero()
        good = int(bad[0, 0]) if bad.numel() else host.shape[0]
        self.losses[torch.from_numpy(ids[:good] // self.shards)] = host[:good]
        self.done += good
        self.save()
        if good < host.shape[0]:
            raise ValueError(
                f"score_dataset: the loss of sample {int(ids[good])} is {float(host[good])}; a reference table holds "
                f"finite losses only: fix the loss or the sample, or leave it out with ids= (the {self.done} samples "
                "scored before it are saved: a rerun continues from it)"
            )
