"""``score_dataset`` over several ranks: each rank scores only the ids of its shard
(``id % W == rank``) into its own shard file, and every rank returns the same table as a
single process scoring everything (under torchrun, 2 gloo ranks on the CPU,
``score_dataset_worker.py``). Ranks as threads (``ThreadWorld``) for what needs no processes:
a preempted rank's shard resumed alone, ranks given other datasets refused on every rank."""

import json
import os
import threading

import pytest
import torch

from neuron_sift import ReferenceTable, score_dataset
from neuron_sift.scoring import reference_folder
from tests.neuron_sift import torchrun
from tests.neuron_sift.epoch.thread_ranks import ThreadWorld
from tests.neuron_sift.scoring.reference_helpers import IdData, Preempted, RecordingLoss, reference_model

WORKER = os.path.join(os.path.dirname(__file__), "score_dataset_worker.py")
N, B = 37, 4


@pytest.mark.slow
def test_two_ranks_score_their_shards_into_the_single_process_table(tmp_path):
    out = torchrun.launch(WORKER, tmp_path, 2, "--samples", str(N), "--batch-size", str(B))
    ranks = torchrun.results(out, 2)
    for rank, r in enumerate(ranks):
        assert r["scored"] == list(range(rank, N, 2)), rank  # its shard only, in id order
        assert r["covered"] == N
    assert ranks[0]["losses"] == ranks[1]["losses"]
    alone = score_dataset(
        reference_model(), IdData(N), RecordingLoss(), tmp_path / "alone", batch_size=B, progress=False
    )
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), alone.losses())
    folder = out / "table"
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "shard-00000-of-00002.pt",
        "shard-00001-of-00002.pt",
    ]
    head = json.loads((folder / "manifest.json").read_text())
    assert (head["shards"], head["covered"], head["description"]) == (2, N, "two ranks")
    torch.testing.assert_close(ReferenceTable.load(folder).losses(), alone.losses())


def in_threads(monkeypatch, world, call, abort=False, wait_s=None):
    """``call(rank)`` on ``world`` ranks in threads; each rank's result or the exception it raised.
    ``abort``: a rank's exception releases the others from the collective they wait in (a
    preempted rank, raising long after the last collective; otherwise every rank raises at the
    same point). ``wait_s``: how long a rank waits for the others in a collective (a rank left
    waiting fails the test then)."""
    w = ThreadWorld(world)
    if wait_s is not None:
        w.barrier = threading.Barrier(world, timeout=wait_s)
    w.patch(monkeypatch)

    def caught(rank):
        try:
            return call(rank)
        except Exception as exc:  # every rank's outcome, not the first error only
            if abort:
                w.barrier.abort()
            return exc

    return w.run([lambda r=r: caught(r) for r in range(world)])


def test_a_preempted_rank_resumes_its_own_shard(tmp_path, monkeypatch):
    """Rank 1 stops at its 4th batch (3 saved); the rerun scores only rank 1's 2 batches left."""
    alone = score_dataset(
        reference_model(), IdData(N), RecordingLoss(), tmp_path / "alone", batch_size=B, progress=False
    )
    first = [RecordingLoss(), RecordingLoss(fail_at=4)]
    models = [reference_model(), reference_model()]  # built here: seeding in threads would race

    def run(losses):
        return lambda r: score_dataset(
            models[r], IdData(N), losses[r], tmp_path / "t", batch_size=B, save_every=1, progress=False
        )

    out = in_threads(monkeypatch, 2, run(first), abort=True)
    assert isinstance(out[1], Preempted) and first[0].calls == 5
    second = [RecordingLoss(), RecordingLoss()]
    tables = in_threads(monkeypatch, 2, run(second))
    assert second[0].calls == 0
    assert [i for ids in second[1].ids for i in ids] == list(range(1, N, 2))[12:]
    for t in tables:
        torch.testing.assert_close(t.losses(), alone.losses())


def test_ranks_given_other_datasets_are_refused_on_every_rank(tmp_path, monkeypatch):
    model = reference_model()

    def call(rank):
        return score_dataset(model, IdData(N + rank), RecordingLoss(), tmp_path / "t", batch_size=B, progress=False)

    out = in_threads(monkeypatch, 2, call)
    for err in out:
        assert isinstance(err, ValueError) and "dataset size differs between ranks: rank 0: 37; rank 1: 38" in str(err)
    assert not (tmp_path / "t").exists()


def test_a_folder_one_rank_refuses_is_refused_on_every_rank(tmp_path, monkeypatch):
    """Rank 1 alone sees a folder it cannot take (as on a filesystem of its own): rank 0 raises too,
    instead of waiting for rank 1 in a later collective."""
    refusal = reference_folder.folder_refusal
    monkeypatch.setattr(
        reference_folder,
        "folder_refusal",
        lambda folder, want: "rank 1 refuses" if torch.distributed.get_rank() == 1 else refusal(folder, want),
    )

    model = reference_model()

    def call(rank):
        return score_dataset(model, IdData(N), RecordingLoss(), tmp_path / "t", batch_size=B, progress=False)

    out = in_threads(monkeypatch, 2, call, wait_s=60)
    assert [str(e) for e in out] == [
        f"score_dataset: another rank refused the folder {tmp_path / 't'}; see its error",
        "rank 1 refuses",
    ]
