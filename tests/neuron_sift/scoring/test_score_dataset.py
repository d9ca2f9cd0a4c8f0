"""``score_dataset``: the loaders' scoring forward over a whole dataset, written as a reference
table. It equals the direct computation, scores only the ids asked for, continues an
interrupted run without rescoring, refuses a folder of other settings, reads the device once
per ``save_every`` batches, pads the last batch only where the backend compiles per shape,
and reports progress on stderr when asked."""

import io
import json

import numpy as np
import pytest
import torch
from torch.utils.data import Subset

from neuron_sift import ReferenceTable, dataset_fingerprint, score_dataset
from neuron_sift.backends import EagerBackend
from neuron_sift.exceptions import LossImplementationNotProvidedException
from neuron_sift.scoring import reference_files as files
from neuron_sift.scoring.progress import ScoringProgress
from tests.neuron_sift.scoring.reference_helpers import IdData, Preempted, RecordingLoss, direct_losses, reference_model

N, B = 50, 8  # 7 batches, the last of 2


def score(path, dataset=None, loss=None, **kwargs):
    kwargs = {"batch_size": B, "progress": False, **kwargs}
    dataset = IdData(N) if dataset is None else dataset
    return score_dataset(reference_model(), dataset, loss if loss is not None else RecordingLoss(), path, **kwargs)


def test_it_equals_the_direct_computation(tmp_path):
    loss = RecordingLoss()
    t = score(tmp_path / "t", loss=loss, description="a model trained on the holdout")
    assert torch.equal(t.losses(), direct_losses(reference_model(), IdData(N), B))
    assert (t.n, t.covered, t.path, t.description) == (N, N, tmp_path / "t", "a model trained on the holdout")
    assert t.fingerprint == dataset_fingerprint(IdData(N))
    assert loss.ids == [list(range(i, min(i + B, N))) for i in range(0, N, B)]  # in id order
    assert loss.grad == [False] * 7 and loss.training == [False] * 7  # no gradients, eval mode


def test_the_model_keeps_its_mode_and_gradients(tmp_path):
    model = reference_model()
    model.train()
    score_dataset(model, IdData(N), RecordingLoss(), tmp_path / "t", batch_size=B, progress=False)
    assert all(m.training for m in model.modules()) and torch.is_grad_enabled()
    assert all(p.grad is None for p in model.parameters())


def test_only_the_ids_given_are_scored(tmp_path):
    ids = [40, 3, 17, 3, 0, 49, 21]
    loss = RecordingLoss()
    t = score(tmp_path / "t", loss=loss, ids=torch.tensor(ids), batch_size=3)
    chosen = sorted(set(ids))
    assert loss.ids == [chosen[:3], chosen[3:]]
    expected = torch.full((N,), float("nan"))
    expected[chosen] = direct_losses(reference_model(), Subset(IdData(N), chosen), 3)
    np.testing.assert_array_equal(t.losses().numpy(), expected.numpy())
    assert t.covered == 6
    head = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert head["ids_sha256"] == files.ids_sha256(np.array(chosen), N) and head["covered"] == 6
    with pytest.raises(ValueError, match="sample id 4 has no loss"):
        t.lookup([4])


def test_ids_outside_the_dataset_or_none_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"id 50 is outside \[0, 50\)"):
        score(tmp_path / "t", ids=[3, 50, 51])
    with pytest.raises(ValueError, match="ids is empty"):
        score(tmp_path / "t", ids=[])
    assert not (tmp_path / "t").exists()


def test_an_interrupted_run_continues_where_it_stopped(tmp_path):
    """Preempted at the 6th batch with a save every 2: 4 batches are saved; the rerun scores
    the 3 left (only those) and the table equals an uninterrupted run's."""
    with pytest.raises(Preempted):
        score(tmp_path / "t", loss=RecordingLoss(fail_at=6), save_every=2)
    with pytest.raises(ValueError, match="incomplete, 32 of 50 samples scored; rerun score_dataset"):
        ReferenceTable.load(tmp_path / "t")
    rest = RecordingLoss()
    t = score(tmp_path / "t", loss=rest, save_every=2)
    assert rest.ids == [list(range(i, min(i + B, N))) for i in range(32, N, B)]
    assert torch.equal(t.losses(), score(tmp_path / "whole").losses())
    again = RecordingLoss()
    assert torch.equal(score(tmp_path / "t", loss=again).losses(), t.losses())
    assert again.calls == 0  # complete: returned at once


def test_a_non_finite_loss_names_its_sample_and_keeps_the_samples_before_it(tmp_path):
    with pytest.raises(ValueError, match=r"the loss of sample 13 is nan; .*the 13 samples scored before it are saved"):
        score(tmp_path / "t", loss=RecordingLoss(nan_at=13), save_every=3)
    rest = RecordingLoss()
    t = score(tmp_path / "t", loss=rest)
    assert rest.ids[0][0] == 13
    torch.testing.assert_close(t.losses(), score(tmp_path / "whole").losses())


@pytest.mark.parametrize(
    "change, named",
    [
        ({"dataset": IdData(40)}, "dataset size: the folder's 50, this call's 40"),
        ({"dataset": IdData(N, seed=1)}, "dataset fingerprint: the folder's '"),
        ({"ids": [1, 2]}, "ids scored \\(sha256 of the ids\\): the folder's None, this call's '"),
    ],
    ids=["size", "fingerprint", "ids"],
)
def test_a_folder_of_other_settings_is_refused(tmp_path, change, named):
    score(tmp_path / "t")
    loss = RecordingLoss()
    with pytest.raises(
        ValueError, match=rf"holds a reference table written with other settings \({named}.*use another path"
    ):
        score(tmp_path / "t", loss=loss, **change)
    assert loss.calls == 0


def test_a_resume_with_another_number_of_ranks_is_refused(tmp_path):
    (tmp_path / "t").mkdir()
    head = files.manifest(N, 2, dataset_fingerprint(IdData(N)), "", None, N)
    files.write_manifest(tmp_path / "t", head)
    with pytest.raises(ValueError, match=r"number of ranks \(shards\): the folder's 2, this call's 1"):
        score(tmp_path / "t")


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "weights.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds files but no manifest.json, so no reference table; use another path"):
        score(tmp_path / "t")


def test_the_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        score(tmp_path / "t", batch_size=0)
    with pytest.raises(ValueError, match="save_every must be an int >= 1, got 0"):
        score(tmp_path / "t", save_every=0)
    with pytest.raises(LossImplementationNotProvidedException, match="not an instance"):
        score_dataset(reference_model(), IdData(N), RecordingLoss, tmp_path / "t", batch_size=B)
    with pytest.raises(TypeError, match="batch_transforms of type int has no transform"):
        score(tmp_path / "t", batch_transforms=3)
    with pytest.raises(TypeError, match="needs a map-style dataset"):
        score(tmp_path / "t", dataset=iter([1]))
    with pytest.raises(RuntimeError, match="distributed=True but torch.distributed is not initialised"):
        score(tmp_path / "t", distributed=True)
    with pytest.raises(TypeError, match="distributed must be None, True or False, got 'yes'"):
        score(tmp_path / "t", distributed="yes")
    with pytest.raises(TypeError, match="description must be a str, got int"):
        score(tmp_path / "t", description=1)
    with pytest.raises(ValueError, match="the dataset is empty"):
        score(tmp_path / "t", dataset=IdData(0))
    assert not (tmp_path / "t").exists()


def test_batch_transforms_and_collate_fn_feed_the_loss(tmp_path):
    class Doubled:
        def transform(self, batch):
            return ("transformed", batch)

    class SeesTransform(RecordingLoss):
        def loss(self, model, transformed_batch, original_batch=None):
            assert transformed_batch[0] == "transformed" and transformed_batch[1] is original_batch
            return super().loss(model, transformed_batch, original_batch)

    def collate(samples):
        x, y, ids = zip(*samples)
        return torch.stack(x) * 0, torch.stack(y), torch.tensor(ids)

    t = score(tmp_path / "t", loss=SeesTransform(), batch_transforms=Doubled(), collate_fn=collate)
    zeros = IdData(N)
    zeros.x = zeros.x * 0
    assert torch.equal(t.losses(), direct_losses(reference_model(), zeros, B))


class CountingBackend(EagerBackend):
    """The CPU, counting host reads; ``per_shape``: answers as a device that compiles a graph per shape."""

    def __init__(self, per_shape=False):
        super().__init__(torch.device("cpu"))
        self.reads = 0
        self.per_shape = per_shape

    def to_host(self, tensor):
        self.reads += 1
        return super().to_host(tensor)

    @property
    def fixed_shapes(self):
        return self.per_shape


def test_losses_are_read_once_per_save_every_batches(tmp_path):
    be = CountingBackend()
    score(tmp_path / "t", backend=be, save_every=3)
    assert be.reads == 3  # 7 batches: 3 + 3 + 1


def test_the_last_batch_is_padded_only_where_the_backend_compiles_per_shape(tmp_path):
    eager, fixed = RecordingLoss(), RecordingLoss()
    a = score(tmp_path / "a", loss=eager, backend=CountingBackend())
    b = score(tmp_path / "b", loss=fixed, backend=CountingBackend(per_shape=True))
    assert eager.shapes[-1] == (2, 6) and set(fixed.shapes) == {(B, 6)}
    assert fixed.ids[-1] == [48, 49] + [49] * 6  # the last sample repeated
    torch.testing.assert_close(a.losses(), b.losses(), rtol=0, atol=1e-6)
    assert b.covered == N


def test_progress_in_a_log_is_a_line_per_tenth(tmp_path, capsys):
    score(tmp_path / "t", progress=True, batch_size=2)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("score_dataset: 50/50 samples scored, ") and lines[-1].endswith(" left")
    assert 10 <= len(lines) <= 11 and "\r" not in "".join(lines)


def test_progress_on_a_terminal_is_one_line_rewritten(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    score(tmp_path / "t", progress=True)
    text = err.getvalue()
    assert text.startswith("\rscore_dataset: ") and text.count("\n") == 1 and text.endswith(" left\n")
    assert text.rsplit("\r", 1)[1].startswith("score_dataset: 50/50 samples scored, ")


def test_no_progress_when_off(tmp_path, capsys):
    score(tmp_path / "t", progress=False)
    assert capsys.readouterr().err == ""


def test_the_progress_line_counts_rate_and_time_left_of_this_call():
    now = [0.0]
    out = io.StringIO()
    p = ScoringProgress(100, 20, True, stream=out, clock=lambda: now[0])
    now[0] = 4.0
    p.update(60)
    assert out.getvalue() == "score_dataset: 60/100 samples scored, 10.0 samples/s, 0:00:04 left\n"
